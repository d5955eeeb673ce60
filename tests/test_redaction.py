"""Secrets never leave a run: not in `gatle-ignite config`, config.json, what a backend is given,
config error messages, the command lines a run shows or records, nor the text of an exception
it records or prints. A secret is a credential-named field, a URL's userinfo or the value of a
URL's query parameter named like a credential."""

import contextlib
import importlib
import io
import json
import logging
import re
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

import gatle_ignite
from gatle_ignite.callbacks.run_record import REDACTED, is_secret_name, redact_text, shown_value
from gatle_ignite.cli.main import main
from gatle_ignite.redaction import is_secret_query_name, redact, redact_argv
from gatle_ignite.run.layout import LOCK_FILE
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.utils.warning_lines import show_framework_warnings_plainly
from tests.backend_fixtures import need, use_wandb_offline
from tests.cli_fixtures.configs import write_config
from tests.conftest import HANG_S, ROOT, child_env
from tests.postgres_server import PostgresServer, find_bindir
from tests.toy import recording_backend
from tests.toy.config_file import write_toy_config
from tests.toy.trainer import Trainer

TESTS_DIR = Path(__file__).resolve().parent

# Every secret holds LEAK, and nothing else does: no output, file or message may show it.
SECRET_FIELDS = {
    "password": "LEAK-password",
    "passwd": "LEAK-passwd",
    "apiKey": "LEAK-apiKey",
    "api_key": "LEAK-api_key",
    "apikey": "LEAK-apikey",
    "token": "LEAK-token",
    "key": "LEAK-key",
    "client_secret": "LEAK-client_secret",
    "db_credentials": {"user": "LEAK-db-user", "pass": "LEAK-db-pass"},
    "hub_url": "https://hub.invalid/LEAK-hub_url",
}
# Non-secret fields whose URLs carry credentials: only the userinfo and secret parameters go.
URL_FIELDS = {
    "data_root": "https://LEAK-user:LEAK-pass@data.invalid/data?sslmode=require&token=LEAK-q",
    "mirrors": ["https://LEAK-user:LEAK-pass@mirror.invalid/x", "https://mirror.invalid/public"],
}
DATA_ROOT_SHOWN = "https://<redacted>@data.invalid/data?sslmode=require&token=<redacted>"
HYPERPARAMETERS = {"max_tokens": 512, "tokenizer_name": "bpe-32k", "crit_keys": ["ce"]}
ALL_FIELDS = {**SECRET_FIELDS, **URL_FIELDS, **HYPERPARAMETERS}


def assert_no_leak(text: str) -> None:
    assert re.findall(r"LEAK[\w-]*", text) == []


@pytest.fixture
def cli_in(monkeypatch, tmp_path):
    """The CLI run from tmp_path, with the fixture modules config files name importable."""
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def recorded_configs():
    recording_backend.CONFIGS.clear()
    yield recording_backend.CONFIGS
    recording_backend.CONFIGS.clear()


# ----------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    "name, secret",
    [
        ("password", True),
        ("db_password", True),
        ("passwd", True),
        ("apiKey", True),
        ("api_key", True),
        ("apikey", True),
        ("APIKey", True),
        ("token", True),
        ("auth-token", True),
        ("hfToken", True),
        ("key", True),
        ("client_secret", True),
        ("MY_SECRET", True),
        ("db_credentials", True),
        ("credential", True),
        ("discord_url", True),
        ("HTTPProxyURL", True),
        ("api_key2", True),
        ("hub_token_secret_id", True),
        # The negative control: hyperparameters that only look like credentials.
        ("max_tokens", False),
        ("tokenizer_name", False),
        # A model config's token ids: redacted, config.json could not rebuild the model.
        ("bos_token_id", False),
        ("pad_token_id", False),
        ("decoder_start_token_id", False),
        ("crit_keys", False),
        ("num_keys", False),
        ("key_dim", False),
        ("keyboard", False),
        ("monkey", False),
        ("url_base", False),
        ("data_root", False),
        ("name", False),
        (3, False),
    ],
)
def test_which_names_are_secret(name, secret):
    assert is_secret_name(name) is secret


@pytest.mark.parametrize(
    "text, shown",
    [
        ("https://user:pass@host/x", "https://<redacted>@host/x"),
        (
            "see s3://key@bucket/a and http://me@h:80",
            "see s3://<redacted>@bucket/a and http://<redacted>@h:80",
        ),
        ("https://user:p@ss@host/x", "https://<redacted>@host/x"),
        ("https://host/x?mail=a@b.c", "https://host/x?mail=a@b.c"),
        ("no url, a@b.c", "no url, a@b.c"),
        # Query parameters named like a credential lose their value; the others stay.
        (
            "postgresql:///db?host=/run/pg&password=pw&sslmode=require&dbname=d",
            f"postgresql:///db?host=/run/pg&password={REDACTED}&sslmode=require&dbname=d",
        ),
        (
            "https://host/x?token=t&password=p",
            f"https://host/x?token={REDACTED}&password={REDACTED}",
        ),
        (
            "get 'https://u:p@b.s3.invalid/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=s&n=1'.",
            f"get 'https://{REDACTED}@b.s3.invalid/k?X-Amz-Credential={REDACTED}"
            f"&X-Amz-Signature={REDACTED}&n=1'.",
        ),
        ("https://a.invalid/c?sv=2024&sig=s%3D", f"https://a.invalid/c?sv=2024&sig={REDACTED}"),
        ("https://h/cb#access_token=t&state=1", f"https://h/cb#access_token={REDACTED}&state=1"),
        # An unset one stays visibly unset; text that is not a URL is left as it is.
        ("https://h/x?api_key=&q=1", "https://h/x?api_key=&q=1"),
        ("not a url: a=b&password=c", "not a url: a=b&password=c"),
    ],
)
def test_url_credentials_are_cut_from_any_text(text, shown):
    assert redact_text(text) == shown


@pytest.mark.parametrize(
    "name, secret",
    [
        *[(name, True) for name in ("password", "passwd", "pwd", "pass", "sslpassword")],
        *[(name, True) for name in ("token", "access_token", "sessiontoken", "id_token")],
        ("X-Amz-Security-Token", True),
        *[(name, True) for name in ("secret", "client_secret", "api_key", "apikey", "key")],
        *[(name, True) for name in ("sig", "signature", "X-Amz-Signature", "X-Amz-Credential")],
        *[(name, True) for name in ("auth", "Authorization", "AccessKey", "secretkey")],
        # The negative control: what makes a URL useful, and names that only look secret.
        *[(name, False) for name in ("host", "sslmode", "dbname", "user", "port", "X-Amz-Date")],
        *[(name, False) for name in ("max_tokens", "tokenizer", "monkey", "key_id", "sv")],
        ("redirect_url", False),
    ],
)
def test_which_query_parameters_are_secret(name, secret):
    assert is_secret_query_name(name) is secret


def test_an_error_shows_a_value_without_its_secrets():
    assert shown_value("api_token", 123) == REDACTED
    assert shown_value("db_credentials.user", "bob") == REDACTED
    assert shown_value("hub_token", "") == "''"
    nested = {"api_key": "sk", "roots": ("https://u:p@h/x",)}
    assert (
        shown_value("name", nested)
        == "{'api_key': '<redacted>', 'roots': ('https://<redacted>@h/x',)}"
    )


# ----------------------------------------------------------------------------- the CLI


def test_config_command_prints_the_config_redacted(cli_in, capsys):
    path = write_config(cli_in, **ALL_FIELDS)
    assert main(["config", "--config", str(path)]) == 0
    captured = capsys.readouterr()
    assert_no_leak(captured.out + captured.err)
    out = captured.out
    for name in SECRET_FIELDS:
        assert f"\n{name}: {REDACTED}\n" in out
    assert f"\ndata_root: {DATA_ROOT_SHOWN}\n" in out
    assert "\n- https://<redacted>@mirror.invalid/x\n- https://mirror.invalid/public\n" in out
    assert "\nmax_tokens: 512\n" in out and "\ntokenizer_name: bpe-32k\n" in out
    assert "\ncrit_keys:\n- ce\n" in out
    assert "\n\nall dotted paths resolve.\n" in out


@pytest.mark.parametrize(
    "override, shown",
    [
        # Refused for its type: the secret field's value is not echoed, nor is it in the reason.
        ("api_token=98765432", "cannot override 'api_token' with <redacted> (of type int)"),
        ("max_epochs='https://u:LEAK@h/x'", "'https://<redacted>@h/x'"),
        ("tags=['https://u:LEAK@h/x', '']", "got ['https://<redacted>@h/x', '']"),
    ],
)
def test_a_refused_override_echoes_no_secret(cli_in, capsys, override, shown):
    path = write_config(cli_in, api_token="LEAK-in-file")
    assert main(["config", "--config", str(path), "--override", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("\nconfig error: ") and shown in err
    assert_no_leak(err)
    assert "98765432" not in err


def test_any_config_error_is_scrubbed_of_url_userinfo(cli_in, capsys):
    # A path that is not dotted Python is quoted by the dispatch check, which knows no secrets.
    path = write_config(cli_in, model_name="https://u:LEAK@h/models")
    assert main(["config", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert "'https://<redacted>@h/models'" in captured.err
    assert_no_leak(captured.out + captured.err)


# ----------------------------------------------------------------------------- a run


def test_a_run_records_no_secret_on_disk_nor_in_a_backend(make_cfg, capsys, recorded_configs):
    cfg = make_cfg(max_epochs=1, logger_name=["text", "csv", "tests.toy.recording_backend"])
    for name, value in ALL_FIELDS.items():
        cfg[name] = value
    Trainer(0, cfg).fit()

    captured = capsys.readouterr()
    assert_no_leak(captured.out + captured.err)
    files = [path for path in Path(cfg.save_dir).rglob("*") if path.is_file()]
    assert {"config.json", "metrics.csv"} <= {path.name for path in files}
    for path in files:
        assert_no_leak(path.read_bytes().decode("latin-1"))

    written = json.loads((Path(cfg.save_dir) / "config.json").read_text(encoding="utf-8"))
    assert {name: written[name] for name in SECRET_FIELDS} == dict.fromkeys(SECRET_FIELDS, REDACTED)
    assert written["data_root"] == DATA_ROOT_SHOWN
    assert written["mirrors"] == ["https://<redacted>@mirror.invalid/x", URL_FIELDS["mirrors"][1]]
    assert {name: written[name] for name in HYPERPARAMETERS} == HYPERPARAMETERS
    assert recorded_configs == [written]


# ----------------------------------------------------------------------------- command lines


@pytest.mark.parametrize(
    "words, shown",
    [
        (["--override", "db_password=pw"], ["--override", f"db_password={REDACTED}"]),
        (["--override=api_key=k"], [f"--override=api_key={REDACTED}"]),
        (["o", "db.credentials.user=bob"], ["o", f"db.credentials.user={REDACTED}"]),
        (["--token", "t", "--api-key=k"], ["--token", REDACTED, f"--api-key={REDACTED}"]),
        (
            ["--override=data_root=https://u:p@h/x"],
            [f"--override=data_root=https://{REDACTED}@h/x"],
        ),
        (["https://u:p@h/x"], [f"https://{REDACTED}@h/x"]),
        (
            ["--storage", "postgresql:///db?host=/s&password=pw"],
            ["--storage", f"postgresql:///db?host=/s&password={REDACTED}"],
        ),
        (
            ["--override=data_root=https://h/x?n=1&token=t"],
            [f"--override=data_root=https://h/x?n=1&token={REDACTED}"],
        ),
        (
            ["logger_params={'api_key': 'k', 'n': 1}"],
            [f"logger_params={{'api_key': '{REDACTED}', 'n': 1}}"],
        ),
        # The negative control: settings and flags that only look like credentials, and an
        # unset credential, which stays visibly unset.
        (
            ["max_tokens=5", "--ckpt", "best", "api_key="],
            ["max_tokens=5", "--ckpt", "best", "api_key="],
        ),
        (["--config=c.py", "resume=True"], ["--config=c.py", "resume=True"]),
    ],
)
def test_a_command_line_is_shown_without_its_secrets(words, shown):
    assert redact_argv(words) == shown


# ----------------------------------------------------------------------------- every output
#
# Each scenario runs once and gives the text of every output it makes; each row of OUTPUTS is
# one output, which must show what it is about (so that an empty capture cannot pass) and no
# secret.

SECRET_OVERRIDES = [
    "--override",
    "db_password=LEAK-password",
    "--override=api_key=LEAK-key",
    "--override",
    "data_root=https://alice:LEAK-url-pw@data.invalid/x?sslmode=require&token=LEAK-url-token",
]
SMALL = {"train_ds_params": {"n": 32, "bs": 16, "shuffle": True, "seed": 0}, "max_epochs": 1}


def _cli(*argv) -> tuple:
    """``main(argv)`` in this process: (exit code or the exception, stdout, stderr); an
    exception is printed as the CLI prints one that leaves it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = main(list(argv))
        except Exception as error:
            sys.excepthook(type(error), error, error.__traceback__)
            result = error
    return result, out.getvalue(), err.getvalue()


def _files(root: Path) -> str:
    return "\n".join(
        path.read_bytes().decode("latin-1") for path in sorted(root.rglob("*")) if path.is_file()
    )


def _toy_config(directory: Path, **fields) -> str:
    fields = {"save_dir": str(directory / "run"), "db_password": "", "api_key": "", **fields}
    return write_toy_config(directory / "toy.py", **{**SMALL, "data_root": "", **fields})


def _secrets_on_the_command_line(directory: Path, patch) -> dict:
    wandb_root = use_wandb_offline(directory, patch)
    config = _toy_config(directory, logger_name=["wandb"])
    argv = ["train", f"--config={config}", *SECRET_OVERRIDES]
    patch.setattr(sys, "argv", ["gatle-ignite", *argv])
    code, out, err = _cli(*argv)
    assert code == 0, err
    importlib.import_module("wandb").teardown()  # flushes the run's files
    return {
        "end-of-run summary": out,
        "stderr": err,
        "W&B run files": _files(wandb_root),
        "run directory files": _files(directory / "run"),
    }


_HOLD = (
    "import sys\n"
    "from gatle_ignite.run.lock import RunLock\n"
    "lock = RunLock(sys.argv[1])\n"
    "lock.acquire()\n"
    "lock.note_holder()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def _a_run_held_by_a_command_with_secrets(directory: Path, patch) -> dict:
    save_dir = directory / "run"
    save_dir.mkdir()
    Manifest.new("toy", {}, "0" * 12).write(save_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(save_dir), *SECRET_OVERRIDES],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert holder.stdout.readline() == "held\n"
        note = (save_dir / LOCK_FILE).read_text()
        _code, status, _err = _cli("status", str(save_dir))
        code, _out, refusal = _cli("train", f"--config={_toy_config(directory)}")
        assert code == 2
    finally:
        holder.stdin.close()
        holder.wait(timeout=HANG_S)
    return {"run.lock holder note": note, "status": status, "lock refusal": refusal}


def _a_failure_quoting_a_url(directory: Path, patch, **fields) -> dict:
    patch.setattr(sys, "excepthook", sys.excepthook)  # main() installs the CLI's own
    engine_log = io.StringIO()
    handler = logging.StreamHandler(engine_log)
    logging.getLogger("ignite.engine.engine.Engine").addHandler(handler)
    try:
        error, out, err = _cli("train", f"--config={_toy_config(directory, **fields)}")
    finally:
        logging.getLogger("ignite.engine.engine.Engine").removeHandler(handler)
    assert isinstance(error, Exception), out
    _code, status, _err = _cli("status", str(directory / "run"))
    return {
        "run.json": (directory / "run" / "run.json").read_text(),
        "status": status,
        "traceback": err,
        "ignite's log (verbosity 2)": engine_log.getvalue(),
    }


def _a_dataset_error(directory: Path, patch) -> dict:
    return _a_failure_quoting_a_url(
        directory, patch, train_ds_name="tests.toy.leaky_data", verbosity=2
    )


def _mlflow_down_at_start(directory: Path, patch) -> dict:
    need("mlflow")
    patch.setenv("MLFLOW_TRACKING_URI", "http://alice:LEAK-mlflow-pw@127.0.0.1:9")
    patch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    patch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    return _a_failure_quoting_a_url(directory, patch, logger_name=["mlflow"])


def _a_warning_quoting_a_url(_directory: Path, _patch) -> dict:
    show_framework_warnings_plainly()
    source = str(Path(gatle_ignite.__file__))
    shown = warnings.formatwarning(
        "cannot reach https://alice:LEAK-warning-pw@h/x?v=2&sig=LEAK-warning-sig",
        UserWarning,
        source,
        1,
    )
    return {"warning line": shown}


def _a_sweep_on_postgresql(directory: Path, _patch) -> dict:
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed (PG_BINDIR to point at them)")
    server = PostgresServer(bindir).start()
    try:
        # The server trusts local connections: the password is sent nowhere, only shown.
        storage = server.create_database("leaky") + "&password=LEAK-pg-pw&sslmode=disable"
        sweep_dir = directory / "sweep"
        argv = ["sweep", f"--config={_toy_config(directory)}", f"--dir={sweep_dir}"]
        argv += ["--trials=1", f"--storage={storage}", "--param=optimizer_params.lr=[0.01]"]
        done = subprocess.run(
            [sys.executable, "-m", "gatle_ignite", *argv, *SECRET_OVERRIDES],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=HANG_S,
            env=child_env(),
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    trial = sweep_dir / "trial_0000"
    return {
        "header": "\n".join(lines[:2]),
        "sweep.json": (sweep_dir / "sweep.json").read_text(),
        "trial output": "\n".join(line for line in lines if line.startswith("[trial_0000]")),
        "best trial's commands": done.stdout.partition("\nBEST: ")[2],
        "stderr": done.stderr,
        "trial's config.json and run.json": _files(trial),
    }


SCENARIOS = {
    "secrets on the command line": _secrets_on_the_command_line,
    "a run held by a command with secrets": _a_run_held_by_a_command_with_secrets,
    "a dataset error": _a_dataset_error,
    "MLflow down at start": _mlflow_down_at_start,
    "a warning": _a_warning_quoting_a_url,
    "a sweep on PostgreSQL": _a_sweep_on_postgresql,
}

URL_SHOWN = f"https://{REDACTED}@"
QUERY_SHOWN = f"?sslmode=require&token={REDACTED}"
DATASET_SHOWN = f"cannot fetch {URL_SHOWN}data.invalid/shard-0.tar?X-Amz-Date=20250101&X-Amz-"
TRACKING_SHOWN = f"API request to http://{REDACTED}@127.0.0.1:9/"
OUTPUTS = [
    # (scenario, output, what it must show): each shows a credential-named field, a URL's
    # userinfo or its query's secret parameter redacted, and the rest of the URL as it was.
    (
        "secrets on the command line",
        "end-of-run summary",
        (f"--override 'db_password={REDACTED}'", QUERY_SHOWN),
    ),
    ("secrets on the command line", "end-of-run summary", ("  resume   gatle-ignite train",)),
    ("secrets on the command line", "stderr", ()),
    ("secrets on the command line", "W&B run files", (f"db_password={REDACTED}", QUERY_SHOWN)),
    ("secrets on the command line", "run directory files", (URL_SHOWN, QUERY_SHOWN)),
    (
        "a run held by a command with secrets",
        "run.lock holder note",
        (f"api_key={REDACTED}", QUERY_SHOWN),
    ),
    ("a run held by a command with secrets", "status", (f"db_password={REDACTED}", QUERY_SHOWN)),
    ("a run held by a command with secrets", "lock refusal", (f"api_key={REDACTED}", QUERY_SHOWN)),
    ("a dataset error", "run.json", (f"OSError: {DATASET_SHOWN}Signature={REDACTED}",)),
    ("a dataset error", "status", (f"OSError: {DATASET_SHOWN}Signature={REDACTED}",)),
    ("a dataset error", "traceback", (f"OSError: {DATASET_SHOWN}Signature={REDACTED}",)),
    ("a dataset error", "ignite's log (verbosity 2)", (f"{DATASET_SHOWN}Signature={REDACTED}",)),
    ("MLflow down at start", "run.json", (TRACKING_SHOWN,)),
    ("MLflow down at start", "status", (TRACKING_SHOWN,)),
    ("MLflow down at start", "traceback", (TRACKING_SHOWN,)),
    ("a warning", "warning line", (f"cannot reach {URL_SHOWN}h/x?v=2&sig={REDACTED}",)),
    ("a sweep on PostgreSQL", "header", ("/leaky?host=/", f"&password={REDACTED}&sslmode=disable")),
    ("a sweep on PostgreSQL", "sweep.json", (f"&password={REDACTED}&sslmode=disable", QUERY_SHOWN)),
    ("a sweep on PostgreSQL", "trial output", ("TRAINING COMPLETE", QUERY_SHOWN)),
    ("a sweep on PostgreSQL", "best trial's commands", ("  evaluate: gatle-ignite", QUERY_SHOWN)),
    ("a sweep on PostgreSQL", "stderr", ()),
    ("a sweep on PostgreSQL", "trial's config.json and run.json", (QUERY_SHOWN,)),
]


@pytest.fixture(scope="module")
def outputs_of(tmp_path_factory):
    """``outputs_of(scenario)``: the scenario's outputs, from running it once."""
    made = {}

    def run(scenario: str) -> dict:
        if scenario not in made:
            directory = tmp_path_factory.mktemp(scenario.replace(" ", "_"))
            with pytest.MonkeyPatch.context() as patch:
                patch.syspath_prepend(str(ROOT))
                patch.chdir(ROOT)
                made[scenario] = SCENARIOS[scenario](directory, patch)
        return made[scenario]

    return run


# A sweep trains a trial in a process of its own, on a server of its own: a slow scenario.
SLOW_SCENARIOS = {"a sweep on PostgreSQL"}


@pytest.mark.parametrize(
    "scenario, output, shown",
    [
        pytest.param(*row, marks=[pytest.mark.slow] if row[0] in SLOW_SCENARIOS else [])
        for row in OUTPUTS
    ],
    ids=[f"{s}: {o}" for s, o, _ in OUTPUTS],
)
def test_no_output_shows_a_secret(outputs_of, scenario, output, shown):
    text = outputs_of(scenario)[output]
    assert [part for part in shown if part not in text] == []
    assert_no_leak(text)


def _a_thread_failing_on(url: str) -> str:
    """What stderr shows when a thread of the process ends on an error quoting ``url``."""

    def fail():
        raise RuntimeError(f"cannot read {url}")

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        thread = threading.Thread(target=fail, name="reader")
        thread.start()
        thread.join()
    return err.getvalue()


def test_a_thread_ending_on_an_error_is_shown_redacted(tmp_path, monkeypatch):
    url = "https://alice:LEAK-thread-pw@data.invalid/x"
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # main() installs the CLI's own
    # Python's own hook (pytest puts one of its own in place), which shows the password.
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    assert "LEAK-thread-pw" in _a_thread_failing_on(url)
    _cli("runs", str(tmp_path))
    shown = _a_thread_failing_on(url)
    assert "Exception in thread reader:" in shown and "RuntimeError: cannot read" in shown
    assert "LEAK-thread-pw" not in shown and "data.invalid/x" in shown


def test_credentials_in_the_environment_are_redacted_from_any_text(monkeypatch):
    secret, token = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "IQoJb3JpZ2luX2VjEXAMPLETOKEN"
    text = f"signing with {secret} and {token} failed"
    assert redact_text(text) == text  # not in the environment: nothing to know them by
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    shown = redact_text(text)
    assert secret not in shown and token not in shown
    assert shown == "signing with <redacted> and <redacted> failed"
    assert redact({"stop_reason": text})["stop_reason"] == shown
    # A command line's words, each looked at with the credentials found once for the line.
    words = ["train", f"--note={secret}", f"name={{'who': '{token}'}}", text]
    assert not any(secret in w or token in w for w in redact_argv(words))
