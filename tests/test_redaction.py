"""Secrets never leave a run: not in `gatle-ignite config`, config.json, what a backend is given,
nor config error messages. A secret is a credential-named field or a URL's userinfo."""

import json
import re
from pathlib import Path

import pytest

from gatle_ignite.callbacks.run_record import REDACTED, is_secret_name, redact_text, shown_value
from gatle_ignite.cli.main import main
from tests.cli_fixtures.configs import write_config
from tests.toy import recording_backend
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
# Non-secret fields whose URLs carry credentials: only the userinfo goes.
URL_FIELDS = {
    "data_root": "https://LEAK-user:LEAK-pass@data.invalid/data",
    "mirrors": ["https://LEAK-user:LEAK-pass@mirror.invalid/x", "https://mirror.invalid/public"],
}
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
        # The negative control: hyperparameters that only look like credentials.
        ("max_tokens", False),
        ("tokenizer_name", False),
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
    ],
)
def test_url_userinfo_is_cut_from_any_text(text, shown):
    assert redact_text(text) == shown


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
    assert "\ndata_root: https://<redacted>@data.invalid/data\n" in out
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
    assert written["data_root"] == "https://<redacted>@data.invalid/data"
    assert written["mirrors"] == ["https://<redacted>@mirror.invalid/x", URL_FIELDS["mirrors"][1]]
    assert {name: written[name] for name in HYPERPARAMETERS} == HYPERPARAMETERS
    assert recorded_configs == [written]
