"""`gatle-ignite sweep`: what is checked before the first trial, and the pruned state of a run.

A mistake in the sweep (a misspelt key, a value of the wrong type, a space that is not one) is a
config error (exit 2) naming it, and nothing is created. The sweeps that train are in
test_sweep_runs.py.
"""

import json
from pathlib import Path

import pytest

from gatle_ignite.cli.main import main
from gatle_ignite.cli.status import run_status
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.sweep.checks import check_sweep
from gatle_ignite.sweep.definition import Sweep
from gatle_ignite.sweep.space import parse_param
from gatle_ignite.sweep.trial import shown_command
from tests.conftest import ROOT

pytest.importorskip("optuna", reason="the sweep extra is not installed")


def _config(tmp_path, **fields):
    fields = {"save_dir": str(tmp_path / "run"), **fields}
    path = tmp_path / "toy_cfg.py"
    path.write_text(
        "from tests.toy.config import toy_config\n\n\n"
        f"def get_config():\n    return toy_config(**{fields!r})\n"
    )
    return path


def _contents(folder: Path):
    """Every path under ``folder``, or None when it does not exist."""
    return sorted(str(p) for p in folder.rglob("*")) if folder.exists() else None


@pytest.fixture
def refused(tmp_path, capsys, monkeypatch):
    """Run a sweep that must be refused: exit 2, the sweep directory never made; the message."""
    monkeypatch.chdir(ROOT)
    config = _config(tmp_path)
    sweep_dir = tmp_path / "sweep"

    def run(*args, config=config):
        before = _contents(sweep_dir)
        code = main(["sweep", f"--config={config}", "--dir", str(sweep_dir), *args])
        err = capsys.readouterr().err
        assert code == 2, err
        assert _contents(sweep_dir) == before
        assert err.startswith("\nconfig error: "), err
        return err

    return run


@pytest.mark.parametrize(
    "item, kind, probes, text",
    [
        ("model_params.hidden=[64, 128, 256]", "choice", (64, 128, 256), "[64, 128, 256]"),
        ("name=['a', 'b']", "choice", ("a", "b"), "['a', 'b']"),
        ("optimizer_params.lr=loguniform(1e-4, 1e-2)", "loguniform", (1e-4, 1e-2), None),
        ("model_params.dropout=uniform(0, 0.5)", "uniform", (0.0, 0.5), "uniform(0.0, 0.5)"),
        ("train_ds_params.bs=int(8, 64)", "int", (8, 64), "int(8, 64)"),
    ],
)
def test_each_form_of_space_parses(item, kind, probes, text):
    param = parse_param(item)
    assert (param.key, param.kind, param.probes()) == (item.split("=")[0], kind, probes)
    if text is not None:
        assert param.text() == text
    # What sweep.json records reads back as the same space.
    assert parse_param(f"{param.key}={param.text()}") == param


@pytest.mark.parametrize(
    "item, message",
    [
        ("optimizer_params.lr", "not of the form KEY=SPACE"),
        ("optimizer_params.lr=logunform(1e-4, 1e-2)", "is not a search space"),
        ("optimizer_params.lr=loguniform(1e-4)", "is not a search space"),
        ("optimizer_params.lr=loguniform(0, 1)", "needs low > 0"),
        ("optimizer_params.lr=uniform(0.5, 0.1)", "needs low < high"),
        ("train_ds_params.bs=int(8, 64.5)", "takes whole numbers"),
        ("model_params.hidden=[]", "at least one value"),
        ("model_params.hidden=[8, 8]", "repeat 8"),
        ("model_params.sizes=[[1, 2], [3]]", "choices must be numbers, strings"),
        ("optimizer_params.lr=__import__('os').system('x')", "is not a search space"),
    ],
)
def test_a_malformed_space_is_refused(item, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse_param(item)


@pytest.mark.parametrize(
    "args, named",
    [
        # A misspelt field, at the top and inside a params mapping: the override's own refusals.
        (["--param", "max_epoch=[1, 2]"], "did you mean 'max_epochs'"),
        (
            ["--param", "optimizer_params.weight_decy=[0.1]"],
            "misspelling of 'optimizer_params.weight_decay'",
        ),
        # A key a params mapping may add, but the component it goes to does not take.
        (["--param", "optimizer_params.lrr=loguniform(1e-4, 1e-2)"], "takes no keyword 'lrr'"),
        (
            ["--param", "model_params.hidden=[4]", "--override", "optimizer_params.lrr=1e-3"],
            "takes no keyword 'lrr'",
        ),
        # A value of the wrong type, and one the config's checks refuse.
        (["--param", "max_epochs=uniform(1, 5)"], "--param max_epochs=uniform(1.0, 5.0)"),
        (["--param", "max_epochs=[3, 0]"], "max_epochs must be an int >= 1, got 0"),
        (["--param", "seed=['one']"], "cannot override 'seed' with 'one'"),
        # A space that is not one, and one a grid cannot walk.
        (["--param", "optimizer_params.lr=logunform(1e-4, 1e-2)"], "is not a search space"),
        (
            ["--sampler", "grid", "--param", "optimizer_params.lr=uniform(0.1, 0.2)"],
            "optimizer_params.lr is a range",
        ),
        (
            ["--sampler", "grid", "--trials", "3", "--param", "model_params.hidden=[4, 8]"],
            "the grid has 2 point(s)",
        ),
        # What the sweep sets for each trial itself, and the sweep's own flags.
        (["--param", "save_dir=['a', 'b']"], "the sweep sets save_dir for each trial itself"),
        (["--param", "model_params.hidden=[4]", "--sampler", "bayes"], "--sampler must be one of"),
        (["--param", "model_params.hidden=[4]", "--workers", "0"], "--workers must be an int >= 1"),
        (["--param", "model_params.hidden=[4]", "--override", "max_epoch=3"], "max_epoch"),
        (["--param", "model_params.hidden=[4]", "--metric", "valid/loss"], "--direction"),
        (["--param", "model_params.hidden=[4]", "--pruner", "median"], None),
    ],
)
def test_a_mistake_in_the_sweep_is_refused_before_anything_is_created(refused, args, named):
    if named is None:
        # The one that passes its checks, but lacks --trials: still refused, still nothing made.
        assert "--trials N" in refused(*args)
        return
    full = [*args] if "--trials" in args else ["--trials", "2", *args]
    err = refused(*full)
    assert named in err, err


def test_a_sweep_file_with_an_unknown_field_is_refused(refused, tmp_path):
    sweep_file = tmp_path / "lr_sweep.py"
    sweep_file.write_text(
        "def get_sweep():\n"
        "    return {'trails': 4, 'params': {'optimizer_params.lr': 'loguniform(1e-4, 1e-2)'}}\n"
    )
    err = refused("--sweep", str(sweep_file))
    assert "'trails' is not a sweep field; did you mean 'trials'?" in err


def test_trials_asked_first_must_lie_in_the_space(refused, tmp_path):
    sweep_file = tmp_path / "lr_sweep.py"
    sweep_file.write_text(
        "def get_sweep():\n"
        "    return {'trials': 2, 'params': {'optimizer_params.lr': [0.1, 0.01]},\n"
        "            'enqueue': [{'optimizer_params.lr': 0.5}]}\n"
    )
    err = refused("--sweep", str(sweep_file))
    assert "enqueue[0] sets optimizer_params.lr=0.5, outside its space [0.1, 0.01]" in err


def test_a_directory_holding_another_sweep_is_refused_and_left_alone(refused, tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    recorded = {
        "sweep_id": "abc",
        "study": "sweep",
        "storage": "study.journal",
        "config": "x.py",
        "config_fingerprint": "sha256:0",
        "overrides": [],
        "params": {"optimizer_params.lr": "[0.1, 0.01]"},
        "metric": "valid/acc",
        "direction": "maximize",
        "trials": 2,
        "sampler": "tpe",
        "pruner": "median",
        "format": 1,
    }
    (sweep_dir / "sweep.json").write_text(json.dumps(recorded))
    err = refused("--trials", "2", "--param", "optimizer_params.lr=[0.1, 0.001]")
    assert "records another sweep than this command asks for" in err
    assert "params: {'optimizer_params.lr': '[0.1, 0.01]'} -> " in err


def test_trial_directories_without_a_sweep_record_are_refused(refused, tmp_path):
    (tmp_path / "sweep" / "trial_0000").mkdir(parents=True)
    err = refused("--trials", "2", "--param", "model_params.hidden=[4]")
    assert "holds trial_0000 but no sweep.json" in err


def test_a_pruned_run_is_finished(make_cfg, capsys):
    """`status` shows it and exits 0; resume=True on it is NOTHING TO DO and changes nothing."""
    from gatle_ignite.cli.launch import launch

    cfg = make_cfg(max_epochs=2)
    launch(cfg)
    manifest = Manifest.read(cfg.save_dir)
    manifest.state, manifest.stop_reason = "pruned", "after epoch 2, valid/acc 0.25"
    manifest.write(cfg.save_dir)
    before = _contents(Path(cfg.save_dir))
    capsys.readouterr()
    assert run_status(cfg.save_dir) == 0
    assert "state:    pruned (after epoch 2, valid/acc 0.25)" in capsys.readouterr().out
    cfg.resume, cfg.max_epochs = True, 4
    launch(cfg)
    out = capsys.readouterr().out
    assert "NOTHING TO DO: the run in" in out and "was pruned by its sweep" in out
    assert _contents(Path(cfg.save_dir)) == before
    assert Manifest.read(cfg.save_dir).trained_epoch == 2


def test_a_worker_that_fails_stops_the_sweep_with_its_error(monkeypatch, capsys):
    """Not a trial's failure (told to the study) but the worker's own, e.g. its storage gone."""
    from types import SimpleNamespace

    from gatle_ignite.launch.budget import Share
    from gatle_ignite.sweep.runner import _ending
    from gatle_ignite.sweep.worker import SweepRun, Worker

    checked = SimpleNamespace(sweep=SimpleNamespace(trials=4), record=None)
    run = SweepRun(checked, study=None, say=print)
    worker = Worker(run, 0, Share(None))

    def storage_gone():
        raise ConnectionError("the database went away")

    monkeypatch.setattr(worker, "_next", storage_gone)
    worker.loop()
    assert "ConnectionError: the database went away" in capsys.readouterr().err
    counts = {"complete": 2, "pruned": 0, "fail": 0}
    assert _ending(run, counts) == (
        1,
        "SWEEP STOPPED: worker 0 failed: ConnectionError('the database went away')",
    )


def test_a_shown_command_overrides_each_key_once_with_the_value_that_counts():
    shown = shown_command("train", "c.py", ["max_epochs=5", "seed=1", "max_epochs=2", "a.b=3"])
    assert shown == (
        "gatle-ignite train --config=c.py --override seed=1 --override max_epochs=2 "
        "--override a.b=3"
    )


def test_a_shown_command_redacts_a_secret_override():
    shown = shown_command("eval", "c.py", ["db_password=hunter2", "seed=1"], "--ckpt", "best")
    assert "hunter2" not in shown and "db_password=<redacted>" in shown and "seed=1" in shown


def test_sweep_json_records_a_secret_override_redacted(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = _config(tmp_path, db_password="")
    sweep = Sweep(
        config=str(config),
        dir=str(tmp_path / "sweep"),
        trials=2,
        params=(parse_param("model_params.hidden=[4, 8]"),),
        overrides=("db_password=hunter2",),
    )
    assert check_sweep(sweep).record.overrides == ["db_password=<redacted>"]
