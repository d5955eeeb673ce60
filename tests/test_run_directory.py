"""The run directory: one run per save_dir, never silently damaged, told through the CLI.

Each test breaks something for real (a finished run resumed, a used save_dir, a changed
config, a damaged file, a second process) and checks what a user would: the exit code, the
message, the lines printed, and every file's bytes and modification time.
"""

import csv
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from ignite.engine import Events

from gatle_ignite.cli.main import main
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.run.layout import MANIFEST_FILE, checkpoint_files
from gatle_ignite.trainer.lifecycle import EXIT_DIVERGED
from tests.conftest import HANG_S, ROOT, child_env
from tests.toy.config_file import write_toy_config
from tests.toy.trainer import Trainer as ToyTrainer

BASE = {"train_ds_params": {"n": 32, "bs": 16, "shuffle": True, "seed": 0}, "max_epochs": 2}


def _config(tmp_path, stem="toy", **fields) -> str:
    """A config file for the toy task, its save_dir in tmp_path/<stem>."""
    fields = {**BASE, "save_dir": str(tmp_path / stem), **fields}
    return write_toy_config(tmp_path / f"{stem}.py", **fields)


def _snapshot(save_dir) -> dict:
    """Every file under save_dir: its bytes' hash and modification time."""
    found = {}
    for path in sorted(Path(save_dir).rglob("*")):
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(save_dir))] = (digest, path.stat().st_mtime_ns)
    return found


def _manifest(save_dir) -> dict:
    return json.loads((Path(save_dir) / MANIFEST_FILE).read_text())


def _indexed(save_dir) -> set:
    return {entry["file"] for entry in _manifest(save_dir)["checkpoints"]}


def _on_disk(save_dir) -> set:
    return {p.name for p in checkpoint_files(save_dir)}


# ---- the manifest ----


def test_a_run_writes_a_readable_manifest_that_indexes_its_checkpoints(tmp_path, cli):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    manifest = _manifest(tmp_path / "toy")
    assert manifest["state"] == "completed"
    assert manifest["name"] == "toy"
    assert manifest["config_fingerprint"].startswith("sha256:")
    assert manifest["config"]["optimizer_params"]["lr"] == 0.01
    assert (manifest["trained_epoch"], manifest["trained_iteration"]) == (2, 4)
    assert _indexed(tmp_path / "toy") == _on_disk(tmp_path / "toy")
    latest = next(e for e in manifest["checkpoints"] if e["kind"] == "latest_epoch")
    assert (latest["file"], latest["epoch"], latest["iteration"]) == (
        "latest_epoch_checkpoint_2.pt",
        2,
        4,
    )


def test_a_diverged_run_is_recorded_as_such(tmp_path, cli):
    nan_from_3 = {
        "dict_of_loss_params": {
            "ce": {"cls_name": "tests.toy.loss", "weight": 1.0},
            "nan": {"cls_name": "tests.toy.nan_loss", "weight": 1.0, "start_iteration": 3},
        }
    }
    assert cli("train", _config(tmp_path, criterion_params=nan_from_3))[0] == EXIT_DIVERGED
    manifest = _manifest(tmp_path / "toy")
    assert manifest["state"] == "diverged"
    assert "iteration 3" in manifest["stop_reason"]


def test_a_crashed_run_is_recorded_as_failed(tmp_path, cli):
    # A model for 5 features fed 8: the first step raises.
    with pytest.raises(RuntimeError):
        cli("train", _config(tmp_path, model_params={"in_dim": 5}))
    manifest = _manifest(tmp_path / "toy")
    assert manifest["state"] == "failed"
    assert manifest["stop_reason"].startswith("RuntimeError")
    # The iteration it failed in never finished.
    assert (manifest["trained_epoch"], manifest["trained_iteration"]) == (0, 0)


# ---- a finished run resumed ----


def test_resuming_a_completed_run_does_nothing_and_says_so(tmp_path, cli):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    before = _snapshot(tmp_path / "toy")
    code, out, _err = cli("train", config, "resume=True")
    assert code == 0
    assert "NOTHING TO DO" in out and "Raise max_epochs" in out
    assert "TRAIN epoch" not in out
    assert _snapshot(tmp_path / "toy") == before


def test_raising_max_epochs_continues_a_completed_run(tmp_path, cli):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    code, out, _err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 0
    assert "TRAIN epoch 3" in out and "TRAIN epoch 2" not in out
    assert (tmp_path / "toy" / "latest_epoch_checkpoint_3.pt").exists()
    assert _manifest(tmp_path / "toy")["trained_epoch"] == 3


def test_a_smaller_max_epochs_than_trained_is_a_config_error(tmp_path, cli):
    config = _config(tmp_path, max_epochs=3)
    assert cli("train", config)[0] == 0
    before = _snapshot(tmp_path / "toy")
    code, out, err = cli("train", config, "resume=True", "max_epochs=2")
    assert code == 2
    assert "config error: max_epochs=2" in err and "epoch 3" in err
    assert "Traceback" not in err and "TRAIN epoch" not in out
    assert _snapshot(tmp_path / "toy") == before


def test_resuming_an_early_stopped_run_does_nothing_until_its_patience_changes(tmp_path, cli):
    flat = {"acc": {"cls_name": "tests.toy.scripted_metric", "params": {"values": [0.5]}}}
    config = _config(tmp_path, max_epochs=6, early_stop_patience=1, val_metrics=flat)
    assert cli("train", config)[0] == 0
    manifest = _manifest(tmp_path / "toy")
    assert manifest["state"] == "early-stopped"
    assert manifest["trained_epoch"] == 2
    before = _snapshot(tmp_path / "toy")
    code, out, _err = cli("train", config, "resume=True")
    assert code == 0 and "stopped early at epoch 2" in out and "TRAIN epoch" not in out
    assert _snapshot(tmp_path / "toy") == before
    code, out, _err = cli("train", config, "resume=True", "early_stop_patience=3")
    assert code == 0 and "TRAIN epoch 3" in out


# ---- a fresh run into a used save_dir ----


def test_a_new_name_gives_the_run_its_own_directory(tmp_path, cli):
    """The docs' sweep by hand: the same config run under other names, each in its own
    save_dir, because the save_dir is named after the run (``ckpt_dir(cfg.name)``)."""
    config = _config(tmp_path)  # name "toy", save_dir tmp_path/toy
    assert cli("train", config)[0] == 0
    before = _snapshot(tmp_path / "toy")
    code, _out, err = cli("train", config, "name=toy_lr1e-3", "optimizer_params.lr=0.001")
    assert code == 0, err
    moved = _manifest(tmp_path / "toy_lr1e-3")
    assert (moved["name"], moved["state"]) == ("toy_lr1e-3", "completed")
    assert moved["config"]["optimizer_params"]["lr"] == 0.001
    assert moved["config"]["save_dir"] == str(tmp_path / "toy_lr1e-3")
    assert _snapshot(tmp_path / "toy") == before
    # A save_dir given with the name is where the run goes.
    elsewhere = tmp_path / "elsewhere"
    assert cli("train", config, "name=other", f"save_dir={elsewhere}")[0] == 0
    assert _manifest(elsewhere)["name"] == "other" and not (tmp_path / "other").exists()


def test_a_fresh_run_into_a_used_save_dir_is_refused_and_touches_nothing(tmp_path, cli):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    before = _snapshot(tmp_path / "toy")
    code, out, err = cli("train", config, "optimizer_params.lr=0.5")
    assert code == 2
    assert "already holds run 'toy'" in err
    assert "resume=True" in err and "replace_run=True" in err
    assert "Traceback" not in err and "TRAIN epoch" not in out
    assert _snapshot(tmp_path / "toy") == before


def _scripted(config, **fields):
    """A Trainer built from a config file by a script, as 0.4 scripts build one."""
    cfg = load_config_from_file(config)
    for key, value in fields.items():
        cfg[key] = value
    return ToyTrainer(0, cfg)


def test_a_scripts_fresh_run_trains_beside_a_finished_run_and_records_nothing_there(tmp_path, cli):
    # 0.4's teacher_student verify script, unchanged: fit() with a shorter max_epochs in the
    # save_dir of the run it checks, after setup() and a handler of its own. A script cannot
    # pass --override; the command still refuses such a run (the test above).
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    before = _snapshot(tmp_path / "toy")
    task = _scripted(config, max_epochs=1).setup()
    assert task.model is not None
    assert _snapshot(tmp_path / "toy") == before
    trained = []
    task.engines["trainer"].add_event_handler(
        Events.ITERATION_COMPLETED, lambda engine: trained.append(engine.state.iteration)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task.fit()
    assert trained == [1, 2]
    assert _snapshot(tmp_path / "toy") == before
    [warning] = [str(w.message) for w in caught]
    assert "holds run 'toy'" in warning and "from a script's fit()" in warning
    assert "trains without writing anything there" in warning and "\n" not in warning


def test_a_run_saving_nothing_trains_beside_a_finished_run_and_writes_nothing_there(tmp_path, cli):
    # The 0.4 teacher_student verify script: save_ckpt=False in the trained run's save_dir,
    # setup() to inspect it, then fit() to watch training.
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    before = _snapshot(tmp_path / "toy")
    task = _scripted(config, save_ckpt=False).setup()
    with pytest.warns(UserWarning, match="save_ckpt=False, so it trains without writing"):
        task.fit()
    assert task.engines["trainer"].state.epoch == 2
    assert _snapshot(tmp_path / "toy") == before
    # Through the CLI too: it trains, says so, and shows no summary of the other run.
    with pytest.warns(UserWarning, match="trains without writing anything there"):
        code, out, _err = cli("train", config, "save_ckpt=False")
    assert code == 0 and "TRAIN epoch 2" in out and "TRAINING COMPLETE after 2 epochs: " not in out
    assert "TRAINING COMPLETE, nothing recorded" in out
    assert _snapshot(tmp_path / "toy") == before


def test_a_script_calling_setup_before_fit_continues_the_run_as_fit_alone_does(tmp_path, cli):
    config = _config(tmp_path, n_saved=1)
    assert cli("train", config)[0] == 0
    before = _snapshot(tmp_path / "toy")
    task = _scripted(config, resume=True, max_epochs=3).setup()
    assert _snapshot(tmp_path / "toy") == before
    task.fit()
    save_dir = tmp_path / "toy"
    manifest = _manifest(save_dir)
    assert (manifest["state"], manifest["trained_epoch"]) == ("completed", 3)
    # The checkpoint handlers belong to the run: its index holds their files, n_saved holds.
    assert _indexed(save_dir) == _on_disk(save_dir)
    assert sorted(p.name for p in save_dir.glob("latest_epoch_*")) == [
        "latest_epoch_checkpoint_3.pt"
    ]
    with open(save_dir / "metrics.csv", encoding="utf-8") as handle:
        epochs = [row["epoch"] for row in csv.DictReader(handle) if row["name"] == "valid/acc"]
    assert epochs == ["1", "2", "3"]


def test_replace_run_replaces_the_old_run_and_eval_then_sees_only_the_new(tmp_path, cli):
    old = _config(tmp_path, max_epochs=3, n_saved=None)
    assert cli("train", old)[0] == 0
    (tmp_path / "toy" / "notes.txt").write_text("mine")
    new = _config(tmp_path, max_epochs=1)
    code, out, _err = cli("train", new, "replace_run=True")
    assert code == 0 and "REPLACED run 'toy'" in out
    names = _on_disk(tmp_path / "toy")
    assert "latest_epoch_checkpoint_1.pt" in names
    assert not any("_3" in n or "_2" in n for n in names)
    assert (tmp_path / "toy" / "notes.txt").read_text() == "mine"
    assert _indexed(tmp_path / "toy") == names
    code, out, _err = cli("eval", new, ckpt="best")
    assert code == 0 and "valid_best_result_checkpoint_1_" in out


# ---- a changed config on resume ----


def test_a_changed_hyperparameter_is_refused_naming_old_and_new(tmp_path, cli):
    config = _config(tmp_path, max_epochs=1)
    assert cli("train", config)[0] == 0
    before = _snapshot(tmp_path / "toy")
    code, out, err = cli(
        "train", config, "resume=True", "max_epochs=2", "optimizer_params.lr=0.001"
    )
    assert code == 2
    assert "optimizer_params.lr: 0.01 -> 0.001" in err
    assert "accept_changes=['optimizer_params.lr']" in err
    assert "TRAIN epoch" not in out and "Traceback" not in err
    assert _snapshot(tmp_path / "toy") == before


def test_a_changed_model_shape_is_refused_without_a_traceback(tmp_path, cli):
    config = _config(tmp_path, max_epochs=1)
    assert cli("train", config)[0] == 0
    code, _out, err = cli("train", config, "resume=True", "model_params={'hidden': 32}")
    assert code == 2 and "model_params" in err and "Traceback" not in err
    code, _out, err = cli(
        "train",
        config,
        "resume=True",
        "max_epochs=2",
        "model_params={'hidden': 32}",
        "accept_changes=['model_params']",
    )
    assert code == 2 and "does not fit" in err


def test_operational_changes_are_allowed(tmp_path, cli):
    loader = {**BASE["train_ds_params"], "num_workers": 0}
    config = _config(tmp_path, max_epochs=1, train_ds_params=loader)
    assert cli("train", config)[0] == 0
    code, out, _err = cli(
        "train",
        config,
        "resume=True",
        "max_epochs=2",
        "n_saved=2",
        "log_every=7",
        "every_val=2",
        "train_ds_params.num_workers=1",
    )
    assert code == 0 and "TRAIN epoch 2" in out


def _trainer_after(config, *overrides):
    from gatle_ignite.cli import launch
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file

    cfg = apply_overrides(load_config_from_file(config), list(overrides))
    return launch.run_task(0, cfg)


def test_an_accepted_learning_rate_is_really_in_the_optimizer(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = _config(tmp_path, max_epochs=1)
    _trainer_after(config)
    task = _trainer_after(
        config,
        "resume=True",
        "max_epochs=2",
        "optimizer_params.lr=0.001",
        "accept_changes=['optimizer_params.lr']",
    )
    assert task.optimizer.param_groups[0]["lr"] == 0.001
    changes = _manifest(tmp_path / "toy")["accepted_changes"]
    assert changes == [{"iteration": 2, "changes": {"optimizer_params.lr": [0.01, 0.001]}}]


def _final_lr(tmp_path, stem, lr, *overrides, **fields):
    config = _config(tmp_path, stem, lr_scheduler="gatle_ignite.schedulers.warmup_cosine", **fields)
    task = _trainer_after(config, f"optimizer_params.lr={lr}", *overrides)
    return config, task.optimizer.param_groups[0]["lr"]


def test_an_accepted_learning_rate_refits_the_schedule_at_the_runs_position(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    _straight, expected = _final_lr(tmp_path, "straight", 0.1, max_epochs=3)
    _old, unchanged = _final_lr(tmp_path, "old", 0.01, max_epochs=3)
    resumed, _ = _final_lr(tmp_path, "resumed", 0.01, max_epochs=2)
    task = _trainer_after(
        resumed,
        "resume=True",
        "max_epochs=3",
        "optimizer_params.lr=0.1",
        "accept_changes=['optimizer_params.lr']",
    )
    # Where a run with the new lr from the start would be; the old schedule would be 10x lower.
    assert task.optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    assert unchanged != pytest.approx(expected)


# ---- one process per save_dir ----


def _popen(config, *overrides):
    return subprocess.Popen(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"]
        + [f"--override={o}" for o in overrides],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_line(process, fragment, limit=HANG_S):
    deadline = time.monotonic() + limit
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        if fragment in line:
            return lines
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"never saw {fragment!r}:\n{''.join(lines)}")


@pytest.mark.slow
def test_a_second_process_is_refused_and_a_killed_holder_blocks_nothing(tmp_path, cli):
    config = _config(tmp_path, max_epochs=1000, train_length=40)
    first = _popen(config)
    try:
        _wait_for_line(first, "TRAIN epoch 2")
        code, out, err = cli("train", config, "resume=True")
        assert code == 2
        assert f"in use by another gatle-ignite process (pid {first.pid}" in err
        assert "TRAIN epoch" not in out and "Traceback" not in err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=HANG_S)
    manifest = _manifest(tmp_path / "toy")
    assert manifest["state"] == "running"  # it never got to say otherwise
    # The kernel dropped the dead holder's lock: the next process gets in and resumes.
    epoch = max(e["epoch"] for e in manifest["checkpoints"] if e["kind"] == "latest_epoch")
    code, out, err = cli("train", config, "resume=True", f"max_epochs={epoch + 1}")
    assert code == 0, err
    assert f"TRAIN epoch {epoch + 1}" in out


# ---- damaged files, the resume choice, rotation and leftovers ----

DAMAGE = {
    # Not 0x80 or "PK" first, which would make them the start of a pickle or a zip archive.
    "random bytes": lambda path: path.write_bytes(b"\x00" + os.urandom(4095)),
    "text": lambda path: path.write_text("this is not a checkpoint\n"),
    "zero bytes": lambda path: path.write_bytes(b""),
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
}
# What the warning says is wrong with each.
WHY = {
    "random bytes": "not a torch checkpoint: neither a zip archive nor a pickle",
    "text": "not a torch checkpoint: neither a zip archive nor a pickle",
    "zero bytes": "the file is empty",
    "truncated": "truncated: a torch archive whose end is missing",
}


def _two_epochs(tmp_path, cli, **fields) -> Path:
    config = _config(tmp_path, n_saved=None, **fields)
    assert cli("train", config)[0] == 0
    return config


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_checkpoint_is_skipped_for_resume_and_eval(tmp_path, cli, damage):
    config = _two_epochs(tmp_path, cli)
    newest = tmp_path / "toy" / "latest_epoch_checkpoint_2.pt"
    DAMAGE[damage](newest)
    why = re.escape(f"latest_epoch_checkpoint_2.pt, which does not load ({WHY[damage]}")
    with pytest.warns(UserWarning, match=why):
        code, out, _err = cli("eval", config, ckpt="latest")
    assert code == 0 and "LOADING CHECKPOINT" in out and "latest_epoch_checkpoint_1.pt" in out
    with pytest.warns(UserWarning, match="latest_epoch_checkpoint_2.pt, which does not load"):
        code, out, _err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 0
    assert "RESUMING FROM" in out and "latest_epoch_checkpoint_1.pt" in out
    assert "TRAIN epoch 2" in out and "TRAIN epoch 3" in out


def test_a_damaged_best_file_is_skipped_for_the_next_best(tmp_path, cli):
    rising = {"acc": {"cls_name": "tests.toy.scripted_metric", "params": {"values": [0.5, 0.6]}}}
    config = _two_epochs(tmp_path, cli, val_metrics=rising)
    DAMAGE["truncated"](tmp_path / "toy" / "valid_best_result_checkpoint_2_0.6000.pt")
    with pytest.warns(UserWarning, match="does not load"):
        code, out, _err = cli("eval", config, ckpt="best")
    assert code == 0 and "valid_best_result_checkpoint_1_0.5000.pt" in out


def test_eval_says_the_checkpoints_are_damaged_not_missing(tmp_path, cli):
    config = _two_epochs(tmp_path, cli)
    for path in (tmp_path / "toy").glob("*.pt"):
        DAMAGE["truncated"](path)
    with pytest.warns(UserWarning, match="does not load"):
        code, _out, err = cli("eval", config, ckpt="best")
    assert code == 2 and "no 'best' checkpoint in" in err and "are damaged" in err
    assert "Train first" not in err and "Traceback" not in err


def test_eval_takes_a_path_and_refuses_a_damaged_one_without_a_traceback(tmp_path, cli):
    config = _two_epochs(tmp_path, cli)
    first = tmp_path / "toy" / "latest_epoch_checkpoint_1.pt"
    code, out, _err = cli("eval", config, ckpt=str(first))
    assert code == 0 and f"LOADING CHECKPOINT: {first}" in out
    DAMAGE["truncated"](first)
    code, _out, err = cli("eval", config, ckpt=str(first))
    assert code == 2 and "cannot load" in err and "Traceback" not in err


def test_a_checkpoint_holding_pickled_code_is_refused_not_skipped(tmp_path, cli):
    config = _two_epochs(tmp_path, cli)
    marker = tmp_path / "pwned"
    torch.save({"model": _Payload(marker)}, tmp_path / "toy" / "latest_epoch_checkpoint_2.pt")
    code, _out, err = cli("eval", config, ckpt="latest")
    assert code == 2 and "refusing to load" in err
    assert not marker.exists()


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def test_resume_picks_the_furthest_trained_checkpoint_not_the_newest_file(tmp_path, cli):
    config = _two_epochs(tmp_path, cli)
    older = tmp_path / "toy" / "latest_epoch_checkpoint_1.pt"
    future = time.time() + 3600
    os.utime(older, (future, future))
    code, out, _err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 0
    assert "latest_epoch_checkpoint_2.pt" in out and "TRAIN epoch 2" not in out


def test_n_saved_holds_across_resumes(tmp_path, cli):
    config = _config(tmp_path, max_epochs=2, n_saved=1, save_every_iters=1)
    assert cli("train", config)[0] == 0
    assert cli("train", config, "resume=True", "max_epochs=4")[0] == 0
    names = _on_disk(tmp_path / "toy")
    assert [n for n in names if n.startswith("latest_epoch")] == ["latest_epoch_checkpoint_4.pt"]
    assert [n for n in names if n.startswith("latest_iter")] == ["latest_iter_checkpoint_7.pt"]
    assert len([n for n in names if "best_result" in n]) == 1
    assert _indexed(tmp_path / "toy") == names


def test_a_lowered_n_saved_rotates_the_surplus_after_the_next_write(tmp_path, cli):
    config = _config(tmp_path, max_epochs=3, n_saved=None)
    assert cli("train", config)[0] == 0
    assert cli("train", config, "resume=True", "max_epochs=4", "n_saved=2")[0] == 0
    latest = sorted(n for n in _on_disk(tmp_path / "toy") if n.startswith("latest_epoch"))
    assert latest == ["latest_epoch_checkpoint_3.pt", "latest_epoch_checkpoint_4.pt"]


def test_what_an_interrupted_write_left_is_removed_on_the_next_start(tmp_path, cli):
    config = _config(tmp_path, max_epochs=1)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    leftovers = [
        run / ".latest_epoch_checkpoint_2.pt.partial-0a1b2c3d",
        run / ".run.json.partial-99887766",
        run / "tmpab12_xyz",
    ]
    for path in leftovers:
        path.write_bytes(b"PK\x03\x04half a checkpoint")
    kept = [run / "notes.txt", run / "tmp_notes.txt", run / ".hidden"]
    for path in kept:
        path.write_text("mine")
    assert cli("train", config, "resume=True", "max_epochs=2")[0] == 0
    assert not any(path.exists() for path in leftovers)
    assert all(path.read_text() == "mine" for path in kept)


def test_an_unindexed_checkpoint_is_adopted_and_a_missing_one_forgotten(tmp_path, cli):
    config = _two_epochs(tmp_path, cli)
    run = tmp_path / "toy"
    manifest = _manifest(run)
    # As if killed between writing a file and indexing it, and a file deleted by hand.
    manifest["checkpoints"] = [
        e for e in manifest["checkpoints"] if e["file"] != "latest_epoch_checkpoint_2.pt"
    ]
    (run / MANIFEST_FILE).write_text(json.dumps(manifest))
    (run / "latest_epoch_checkpoint_1.pt").unlink()
    code, out, _err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 0 and "latest_epoch_checkpoint_2.pt" in out
    assert _indexed(run) == _on_disk(run)


def test_a_04_run_directory_without_a_manifest_resumes(tmp_path, cli):
    config = _two_epochs(tmp_path, cli)
    (tmp_path / "toy" / MANIFEST_FILE).unlink()
    code, out, _err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 0 and "latest_epoch_checkpoint_2.pt" in out and "TRAIN epoch 3" in out
    assert _indexed(tmp_path / "toy") == _on_disk(tmp_path / "toy")


# ---- gatle-ignite status ----


def _status(save_dir, capsys) -> tuple:
    code = main(["status", str(save_dir)])
    return code, capsys.readouterr().out


def test_status_says_what_a_run_directory_holds(tmp_path, cli, capsys):
    assert cli("train", _config(tmp_path))[0] == 0
    code, out = _status(tmp_path / "toy", capsys)
    assert code == 0
    assert "state:    completed" in out and "latest_epoch_checkpoint_2.pt" in out
    assert "trained:  2 epoch(s), iteration 4" in out


def test_status_tells_a_part_epoch_apart_from_a_whole_one(tmp_path, cli, capsys):
    assert cli("train", _config(tmp_path))[0] == 0
    manifest = _manifest(tmp_path / "toy")
    manifest.update(state="preempted", trained_epoch=3, trained_iteration=5)
    (tmp_path / "toy" / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert (
        "trained:  2 epoch(s) and 1/2 iterations of epoch 3" in _status(tmp_path / "toy", capsys)[1]
    )


def test_status_exits_75_for_a_preempted_or_killed_run_1_for_a_failed_one_65_a_diverged_one(
    tmp_path, cli, capsys
):
    config = _config(tmp_path, max_epochs=1)
    assert cli("train", config)[0] == 0
    manifest = _manifest(tmp_path / "toy")
    shown = {"preempted": "preempted", "running": "interrupted", "failed": "failed"}
    for state, expected in (("preempted", 75), ("running", 75), ("failed", 1), ("diverged", 65)):
        manifest["state"] = state
        (tmp_path / "toy" / MANIFEST_FILE).write_text(json.dumps(manifest))
        code, out = _status(tmp_path / "toy", capsys)
        assert code == expected, state
        # "running" with no live holder: the process was killed.
        assert f"state:    {shown.get(state, state)}" in out


def test_status_of_a_directory_without_a_run_is_a_config_error(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    assert "holds no gatle-ignite run: nothing: it is empty" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err


def test_status_of_an_lr_find_plot_says_so_and_not_that_it_is_a_0_4_run(tmp_path, capsys):
    (tmp_path / "lr_find.png").write_bytes(b"\x89PNG")
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "only lr_find.png, the plot `gatle-ignite lr-find` writes, which trains no run" in err
    assert "0.4" not in err
    (tmp_path / "latest_epoch_checkpoint_1.pt").write_bytes(b"")
    assert main(["status", str(tmp_path)]) == 2
    assert "a run of gatle-ignite 0.4" in capsys.readouterr().err


# ---- under two ranks ----

GLOO = ["dist_backend='gloo'", "auto_model_params.sync_bn=False", "nproc_per_node=2"]


def _cli_process(config, *overrides):
    return subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"]
        + [f"--override={o}" for o in (*GLOO, *overrides)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


@pytest.mark.slow
def test_a_rank_aborting_at_exit_after_a_refusal_still_ends_in_the_config_error(tmp_path):
    # gloo may abort a rank as it exits; torch then reports that rank's signal.
    config = _config(
        tmp_path, max_epochs=1, main_runner="tests.toy.dist_trainer", fault_abort_at_exit_rank=-1
    )
    assert _cli_process(config).returncode == 0
    refused = _cli_process(config, "fault_abort_at_exit_rank=1")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.count("config error: save_dir") == 1
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_two_ranks_keep_one_manifest_refuse_together_and_resume(tmp_path):
    config = _config(tmp_path, max_epochs=1, main_runner="tests.toy.dist_trainer")
    assert _cli_process(config).returncode == 0
    assert _manifest(tmp_path / "toy")["state"] == "completed"
    assert _indexed(tmp_path / "toy") == _on_disk(tmp_path / "toy")
    before = _snapshot(tmp_path / "toy")
    refused = _cli_process(config)
    # Rank 0 decided, every rank learned it: one config error, no traceback, nothing touched.
    assert refused.returncode == 2
    assert refused.stderr.count("config error: save_dir") == 1
    assert "Traceback" not in refused.stderr
    # Nor torch's warning that it stopped the other rank: the config error says why.
    assert "Terminating process" not in refused.stderr
    assert _snapshot(tmp_path / "toy") == before
    resumed = _cli_process(config, "resume=True", "max_epochs=2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "RESUMING FROM" in resumed.stdout and "TRAIN epoch 2" in resumed.stdout
    assert _manifest(tmp_path / "toy")["trained_epoch"] == 2
    # Each start records the world it trained in, and the command that started it.
    starts = _manifest(tmp_path / "toy")["provenance"]
    assert [(s["action"], s["world_size"]) for s in starts] == [("fresh", 2), ("resume", 2)]
    assert starts[1]["command"][-2:] == ["--override=resume=True", "--override=max_epochs=2"]


@pytest.mark.slow
def test_a_crash_on_rank_1_is_recorded_as_rank_1s_error_not_rank_0s_symptom(tmp_path):
    config = _config(
        tmp_path,
        max_epochs=2,
        main_runner="tests.toy.dist_trainer",
        train_ds_params={"n": 128, "bs": 16, "shuffle": True},
        fault_crash_rank=1,
        fault_crash_at=3,
    )
    crashed = _cli_process(config)
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    manifest = _manifest(tmp_path / "toy")
    assert manifest["state"] == "failed"
    assert manifest["stop_reason"] == (
        "rank 1: RuntimeError: injected crash on rank 1 at iteration 3"
    )
