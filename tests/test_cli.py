"""The ``gatle-ignite`` command line (CONTRACT 2.1-2.4), in-process and as a real subprocess."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from cli_fixtures import trainer as fixture_trainer
from cli_fixtures.configs import write_config

from gatle_ignite import __version__
from gatle_ignite.cli import launch
from gatle_ignite.cli.main import DRY_RUN_HINT, build_parser, main
from gatle_ignite.dispatch import ConfigError
from tests.conftest import HANG_S

TESTS_DIR = Path(__file__).resolve().parent
MISSING = "cli_fixtures.does_not_exist"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    # syspath_prepend also restores sys.path, which the CLI extends with the working directory.
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fixture_trainer, "CALLS", [])


def _run_cli(*args, cwd):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "gatle_ignite", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


# ----------------------------------------------------------------------------- parser


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"gatle-ignite {__version__}"


def test_version_does_not_import_torch():
    code = (
        "import sys\n"
        "import gatle_ignite.cli.main as cli\n"
        "try:\n"
        "    cli.main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('torch', 'ignite') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, check=True
    )
    assert result.stdout.splitlines() == [f"gatle-ignite {__version__}", "[]"]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["train"],
        ["config"],
        ["eval", "--config", "a.py", "--ckpt", "oldest"],
        ["init"],
        ["train", "--config", "a.py", "--task", "x"],
    ],
)
def test_argument_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: gatle-ignite" in capsys.readouterr().err


def test_parser_defaults():
    parser = build_parser()
    assert parser.prog == "gatle-ignite"
    init = parser.parse_args(["init", "proj"])
    assert (init.command, init.name, init.directory, init.force) == ("init", "proj", ".", False)
    train = parser.parse_args(["train", "--config=a.py"])
    assert (train.config, train.override) == ("a.py", [])
    evaluate = parser.parse_args(
        ["eval", "--config", "a.py", "--override", "x=1", "--override=y=2"]
    )
    assert (evaluate.ckpt, evaluate.override) == ("best", ["x=1", "y=2"])


def test_help_lists_the_usage_forms(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for form in ("gatle-ignite init NAME", "gatle-ignite train", "gatle-ignite eval", "config"):
        assert form in out


# ----------------------------------------------------------------------------- init


def test_init_dispatches_to_init_project(monkeypatch):
    seen = []

    def init_project(name, directory=".", force=False):
        seen.append((name, directory, force))
        return 0

    fake = types.ModuleType("gatle_ignite.cli.init")
    fake.init_project = init_project
    monkeypatch.setitem(sys.modules, "gatle_ignite.cli.init", fake)
    path_before = list(sys.path)
    assert main(["init", "proj", "--dir", "somewhere", "--force"]) == 0
    assert seen == [("proj", "somewhere", True)]
    assert sys.path == path_before


def test_init_config_error_exits_2(monkeypatch, capsys):
    def refuse(name, directory=".", force=False):
        raise ConfigError(f"{name!r} is not a usable project name")

    fake = types.ModuleType("gatle_ignite.cli.init")
    fake.init_project = refuse
    monkeypatch.setitem(sys.modules, "gatle_ignite.cli.init", fake)
    assert main(["init", "1bad"]) == 2
    assert capsys.readouterr().err == "\nconfig error: '1bad' is not a usable project name\n"


# ----------------------------------------------------------------------------- config


def test_config_prints_and_checks_each_path(tmp_path, capsys):
    first = write_config(tmp_path, "first")
    second = write_config(tmp_path, "second", max_epochs=3)
    assert main(["config", f"--config= {first}, ,{second},", "--override", "max_epochs=9"]) == 0
    out = capsys.readouterr().out
    assert out.count("all dotted paths resolve.") == 2
    assert f"===== {first} =====" in out and f"===== {second} =====" in out
    assert out.index(f"===== {second} =====") > out.index("all dotted paths resolve.")
    assert "max_epochs: 9" in out and "max_epochs: 3" not in out
    assert "main_runner: cli_fixtures.trainer" in out
    assert "\n\nall dotted paths resolve.\n" in out
    assert fixture_trainer.CALLS == []


def test_config_with_broken_paths_exits_2(tmp_path, capsys):
    path = write_config(tmp_path, model_name=MISSING, optimizer_name=MISSING)
    assert main(["config", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("\nconfig error: 2 dotted path(s)")
    assert "config field 'model_name'" in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert "all dotted paths resolve" not in captured.out


def test_config_names_the_extra_of_a_backend_whose_package_is_missing(
    tmp_path, capsys, monkeypatch
):
    # None in sys.modules: the package counts as absent, exactly as an uninstalled one.
    monkeypatch.setitem(sys.modules, "mlflow", None)
    path = write_config(tmp_path, logger_name=["text", "mlflow"])
    assert main(["config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("\nconfig error: logger_name names 'mlflow'")
    assert 'pip install "gatle-ignite[mlflow]"' in err and "Traceback" not in err


@pytest.mark.parametrize(
    "fields, overrides, phrase",
    [
        ({"name": None}, [], "'name'"),
        ({}, ["max_epoch=1"], "cannot override unknown config field 'max_epoch'"),
        ({}, ["max_epochs"], "is not of the form key=value"),
        ({"n_saved": 0}, [], "n_saved must be an int >= 1"),
    ],
)
def test_config_errors_exit_2_without_traceback(tmp_path, capsys, fields, overrides, phrase):
    path = write_config(tmp_path, **fields)
    argv = ["config", "--config", str(path), *(f"--override={item}" for item in overrides)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("\nconfig error: ") and phrase in err
    assert "Traceback" not in err


def test_missing_config_file_exits_2(capsys):
    assert main(["train", "--config", "nowhere.py"]) == 2
    assert "config error: config file not found: nowhere.py" in capsys.readouterr().err


def test_config_naming_no_file_exits_2(capsys):
    assert main(["train", "--config", " , "]) == 2
    assert "config error: " in capsys.readouterr().err


def test_other_exceptions_propagate(tmp_path):
    path = tmp_path / "boom.py"
    path.write_text("def get_config():\n    return 1 / 0\n")
    with pytest.raises(ZeroDivisionError):
        main(["config", "--config", str(path)])


def test_working_directory_is_made_importable(tmp_path, monkeypatch, capsys):
    (tmp_path / "cwd_only_runner.py").write_text("from cli_fixtures.trainer import Trainer\n")
    path = write_config(tmp_path, main_runner="cwd_only_runner")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["config", "--config", str(path)]) == 0
    assert sys.path[0] == os.getcwd()
    assert "all dotted paths resolve." in capsys.readouterr().out


# ----------------------------------------------------------------------------- train / eval


def test_train_one_config_fits_in_process(tmp_path, capsys):
    path = write_config(tmp_path)
    assert main(["train", "--config", str(path), "--override", "max_epochs=5"]) == 0
    [(call, local_rank, cfg)] = fixture_trainer.CALLS
    assert (call, local_rank, cfg.max_epochs) == ("fit", 0, 5)
    assert "run" not in cfg
    assert "fixture fit: max_epochs=5" in capsys.readouterr().out


def test_eval_sets_inference_mode(tmp_path):
    path = write_config(tmp_path)
    assert main(["eval", "--config", str(path), "--ckpt", "latest"]) == 0
    [(call, _local_rank, cfg)] = fixture_trainer.CALLS
    assert call == "evaluate"
    assert cfg.run is True and cfg.load_from_ckpt == "latest"


def test_eval_defaults_to_the_best_checkpoint(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(launch, "launch", seen.append)
    assert main(["eval", "--config", str(write_config(tmp_path))]) == 0
    assert seen[0].load_from_ckpt == "best"


def test_eval_refuses_several_configs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(launch, "launch", lambda cfg: pytest.fail("eval must not launch"))
    a, b = write_config(tmp_path, "a"), write_config(tmp_path, "b")
    assert main(["eval", f"--config={a},{b}"]) == 2
    err = capsys.readouterr().err
    assert err.count("eval takes one --config") == 1
    assert f"eval takes one --config, got 2: {a}, {b}" in err
    assert "train" in err


def test_train_several_configs_fans_out_without_loading_them(monkeypatch):
    seen = []

    def launch_many(paths, extra_args):
        seen.append((paths, extra_args))
        return 1

    monkeypatch.setattr(launch, "launch_many", launch_many)
    monkeypatch.setattr(launch, "launch", lambda cfg: pytest.fail("parent must not train"))
    argv = ["train", "--config=nowhere_a.py, nowhere_b.py", "--override", "max_epochs=1"]
    assert main([*argv, "--override", "train_length=2"]) == 1
    assert seen == [
        (["nowhere_a.py", "nowhere_b.py"], ["--override=max_epochs=1", "--override=train_length=2"])
    ]


# ----------------------------------------------------------------------------- subprocess


def test_subprocess_config_succeeds(tmp_path):
    path = write_config(tmp_path)
    result = _run_cli("config", f"--config={path.name}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"===== {path.name} =====\n")
    assert result.stdout.endswith(f"\n\nall dotted paths resolve.\n{DRY_RUN_HINT}\n")


def test_subprocess_config_error_exits_2_without_traceback(tmp_path):
    path = write_config(tmp_path, complete=False, name="incomplete")
    result = _run_cli("train", f"--config={path}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("\nconfig error: ")
    assert "'save_dir'" in result.stderr and "Traceback" not in result.stderr


def test_subprocess_eval_with_two_configs(tmp_path):
    result = _run_cli("eval", "--config=a.py,b.py", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("eval takes one --config") == 1


def test_status_help_names_every_exit_code_status_returns(tmp_path, capsys):
    from gatle_ignite.cli import status
    from gatle_ignite.trainer.lifecycle import EXIT_DIVERGED
    from gatle_ignite.trainer.preemption import EXIT_PREEMPTED

    with pytest.raises(SystemExit) as done:
        main(["status", "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    codes = [
        (status.EXIT_FINISHED, "finished"),
        (EXIT_PREEMPTED, "resumable"),
        (status.EXIT_FAILED, "failed"),
        (EXIT_DIVERGED, "diverged"),
        (status.EXIT_RUNNING, "training now"),
        (2, "not a run"),
    ]
    for code, meaning in codes:
        assert f"{code} {meaning}" in shown
    # A directory that holds no run: the config error's 2, as the help says.
    assert main(["status", str(tmp_path)]) == 2
