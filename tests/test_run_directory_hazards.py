"""The run directory against what a red-team pass found: links out of save_dir, user folders
named like temporary files, a kill in a slow teardown, only a best file on disk, accepted changes
that did more than was accepted, files rotated out under a reader, a holder on another host, a
file system that refuses writes, and a run.json of valid JSON with wrong types.

Each test breaks the thing for real and checks what a user would: exit codes, messages, files.
"""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gatle_ignite.cli.main import main
from gatle_ignite.run import directory, lock
from gatle_ignite.run.layout import MANIFEST_FILE
from tests.conftest import HANG_S, ROOT, child_env
from tests.test_run_directory import _config, _manifest, _snapshot, _status


def _write_manifest(save_dir: Path, manifest: dict) -> None:
    (save_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))


# ---- links out of save_dir ----


@pytest.mark.parametrize("name", ["metrics.csv", "run.lock", "config.json", "run.json"])
def test_a_link_out_of_save_dir_is_refused_and_its_target_untouched(tmp_path, cli, name):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    run = tmp_path / "toy"
    run.mkdir()
    (run / name).symlink_to(outside)
    code, out, err = cli("train", _config(tmp_path))
    assert code == 2, err
    assert f"{run / name} is a symbolic link to {outside}, outside {run}" in err
    assert "TRAIN epoch" not in out
    assert outside.read_text() == "keep me\n"


def test_a_resume_never_appends_through_a_metrics_link_out_of_save_dir(tmp_path, cli):
    config = _config(tmp_path, max_epochs=1)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    outside = tmp_path / "precious.csv"
    outside.write_text("keep me\n")
    (run / "metrics.csv").unlink()
    (run / "metrics.csv").symlink_to(outside)
    code, _out, err = cli("train", config, "resume=True", "max_epochs=2")
    assert code == 2 and "metrics.csv is a symbolic link" in err
    assert outside.read_text() == "keep me\n"
    assert _manifest(run)["state"] == "completed"


def test_a_link_that_stays_inside_save_dir_is_written_through(tmp_path, cli):
    # The control: only links that leave save_dir are refused.
    run = tmp_path / "toy"
    run.mkdir()
    (run / "history.csv").write_text("")
    (run / "metrics.csv").symlink_to(run / "history.csv")
    assert cli("train", _config(tmp_path))[0] == 0
    assert (run / "history.csv").read_text().startswith("wall_time,epoch,step,name,value")


# ---- names that look like staging files ----


def test_user_folders_named_like_temporary_files_survive_every_start(tmp_path, cli):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    folders = [run / "tmp_results", run / "tmp_2024_01"]
    for folder in folders:
        folder.mkdir()
        (folder / "table.csv").write_text("a,b\n1,2\n")
    # tempfile's pattern and the staging mark, but a user's text: not a write of ours.
    (run / "tmp_notes_1").write_text("my notes\n")
    (run / ".notes.partial-1").write_text("my draft\n")
    # What a kill mid-write left: a resume that changes nothing leaves even that.
    (run / ".latest_epoch_checkpoint_3.pt.partial-0a1b2c3d").write_bytes(b"PK\x03\x04half")
    before = _snapshot(run)
    code, out, _err = cli("train", config, "resume=True")
    assert code == 0 and "NOTHING TO DO" in out
    assert _snapshot(run) == before
    assert cli("train", config, "resume=True", "max_epochs=3")[0] == 0
    for folder in folders:
        assert (folder / "table.csv").read_text() == "a,b\n1,2\n"
    assert (run / "tmp_notes_1").read_text() == "my notes\n"
    assert (run / ".notes.partial-1").read_text() == "my draft\n"
    assert not (run / ".latest_epoch_checkpoint_3.pt.partial-0a1b2c3d").exists()


# ---- a kill during the teardown ----


def _spawn(config, log: Path, *overrides) -> subprocess.Popen:
    with open(log, "w") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"]
            + [f"--override={o}" for o in overrides],
            cwd=ROOT,
            env=child_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def _wait_for_file(process, path: Path, log: Path, limit=HANG_S) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_kill_while_a_backend_finishes_leaves_a_finished_run(tmp_path, cli, capsys):
    marker = tmp_path / "finishing"
    config = _config(
        tmp_path,
        logger_name=["tests.toy.slow_finish_backend"],
        slow_finish_marker=str(marker),
    )
    log = tmp_path / "train.log"
    process = _spawn(config, log)
    try:
        # Its finish() sleeps, as a W&B or MLflow upload at the end can take seconds.
        _wait_for_file(process, marker, log)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=HANG_S)
    run = tmp_path / "toy"
    assert _manifest(run)["state"] == "completed"
    code, out = _status(run, capsys)
    assert code == 0 and "state:    completed" in out
    code, out, err = cli("train", config, "resume=True")
    assert code == 0, err
    assert (
        "NOTHING TO DO" in out
        and "TRAINING COMPLETE after" in out
        and "TRAINING RUNNING" not in out
    )


def test_resuming_a_finished_run_still_recorded_running_repairs_it(tmp_path, cli, capsys):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    # What a kill in the teardown left before the end was recorded first.
    manifest = _manifest(run)
    manifest["state"] = "running"
    _write_manifest(run, manifest)
    assert _status(run, capsys)[0] == 75
    code, out, err = cli("train", config, "resume=True")
    assert code == 0, err
    assert "NOTHING TO DO" in out and "REPAIRED" in out and "TRAINING COMPLETE after" in out
    assert _status(run, capsys)[0] == 0
    code, out, _err = cli("train", config, "resume=True")
    assert code == 0 and "NOTHING TO DO" in out and "REPAIRED" not in out


# ---- only a best file on disk ----


def _only_the_best_file(run: Path) -> str:
    """The directory as a kill between the first epoch's best and latest writes leaves it."""
    manifest = _manifest(run)
    best = next(e["file"] for e in manifest["checkpoints"] if e["kind"] == "best")
    for entry in manifest["checkpoints"]:
        if entry["file"] != best:
            (run / entry["file"]).unlink()
    manifest["checkpoints"] = [e for e in manifest["checkpoints"] if e["file"] == best]
    manifest["state"] = "running"
    _write_manifest(run, manifest)
    return best


def test_a_run_with_only_a_best_file_resumes_from_it_as_status_says(tmp_path, cli, capsys):
    config = _config(tmp_path)
    assert cli("train", config, "max_epochs=1")[0] == 0
    run = tmp_path / "toy"
    best = _only_the_best_file(run)
    code, out = _status(run, capsys)
    assert code == 75 and "state:    interrupted" in out
    with pytest.warns(UserWarning, match=f"resuming from its best file {best}"):
        code, out, err = cli("train", config, "resume=True")
    assert code == 0, err
    assert f"RESUMING FROM: {run / best}" in out
    assert "TRAIN epoch 1" not in out and "TRAIN epoch 2" in out
    assert _manifest(run)["state"] == "completed"


def test_a_best_file_without_a_training_state_is_refused_saying_why(tmp_path, cli):
    config = _config(tmp_path)
    assert cli("train", config, "max_epochs=1")[0] == 0
    run = tmp_path / "toy"
    best = _only_the_best_file(run)
    weights = torch.load(run / best, weights_only=True)["model"]
    (run / best).unlink()
    torch.save({"model": weights}, run / best)
    code, _out, err = cli("train", config, "resume=True")
    assert code == 2
    assert "no best file holds a training state" in err and best in err
    assert "this is a fresh run" not in err and "Traceback" not in err


# ---- accepted changes do what was accepted, no more ----


def _lrs(run: Path) -> dict:
    rows = (run / "metrics.csv").read_text().splitlines()[1:]
    cells = [row.split(",") for row in rows]
    return {int(c[2]): float(c[4]) for c in cells if c[3] == "train/lr_0"}


def test_an_accepted_change_keeps_the_schedules_length_when_max_epochs_is_raised(tmp_path, cli):
    schedule = {"lr_scheduler": "gatle_ignite.schedulers.warmup_cosine", "log_every": 1}
    # The reference: a run made with the new lr, resumed to 4 epochs without a change.
    plain = _config(
        tmp_path, "plain", optimizer_params={"lr": 0.1, "weight_decay": 0.0}, **schedule
    )
    assert cli("train", plain)[0] == 0
    with pytest.warns(UserWarning, match="keeps its 2-epoch length"):
        assert cli("train", plain, "resume=True", "max_epochs=4")[0] == 0
    changed = _config(tmp_path, "changed", **schedule)
    assert cli("train", changed)[0] == 0
    with pytest.warns(UserWarning, match="keeps its 2-epoch length"):
        code, _out, err = cli(
            "train",
            changed,
            "resume=True",
            "max_epochs=4",
            "optimizer_params.lr=0.1",
            "accept_changes=['optimizer_params.lr']",
        )
    assert code == 0, err
    expected, got = _lrs(tmp_path / "plain"), _lrs(tmp_path / "changed")
    later = range(5, 9)
    assert [got[step] for step in later] == pytest.approx([expected[step] for step in later])
    latest = torch.load(tmp_path / "changed" / "latest_epoch_checkpoint_4.pt", weights_only=True)
    assert latest["run_meta"]["max_epochs"] == 2


def test_accept_changes_naming_a_typo_or_an_unchanged_field_is_refused(tmp_path, cli):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    before = _snapshot(run)
    code, _out, err = cli(
        "train", config, "resume=True", "max_epochs=3", "accept_changes=['optimizer_params.lrr']"
    )
    assert code == 2 and "'optimizer_params.lrr', which is no field of the config" in err
    code, _out, err = cli(
        "train", config, "resume=True", "max_epochs=3", "accept_changes=['optimizer_params.lr']"
    )
    assert code == 2 and "'optimizer_params.lr', but this resume does not change it" in err
    code, _out, err = cli(
        "train", config, "resume=True", "max_epochs=3", "accept_changes=['n_saved']"
    )
    assert code == 2 and "which a resume may change without accepting it" in err
    assert _snapshot(run) == before
    # Accepted once, the change is the run's: the same command requeued goes on.
    accepting = ("optimizer_params.lr=0.001", "accept_changes=['optimizer_params.lr']")
    assert cli("train", config, "resume=True", "max_epochs=3", *accepting)[0] == 0
    code, out, err = cli("train", config, "resume=True", "max_epochs=4", *accepting)
    assert code == 0, err
    assert "TRAIN epoch 4" in out
    assert [c["changes"] for c in _manifest(run)["accepted_changes"]] == [
        {"optimizer_params.lr": [0.01, 0.001]}
    ]


# ---- a file rotated out between listing and reading ----


@pytest.mark.parametrize("reader", ["load_checkpoint_file", "read_origin"])
def test_a_checkpoint_rotated_out_under_eval_is_not_there(tmp_path, cli, monkeypatch, reader):
    config = _config(tmp_path, n_saved=None)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    newest = run / "latest_epoch_checkpoint_2.pt"
    if reader == "read_origin":
        # Written after eval read the index: a file eval adopts from the listing.
        manifest = _manifest(run)
        manifest["checkpoints"] = [e for e in manifest["checkpoints"] if e["file"] != newest.name]
        _write_manifest(run, manifest)
    real = getattr(directory, reader)

    def rotated_out_first(path, *args, **kwargs):
        if Path(path) == newest:
            newest.unlink(missing_ok=True)  # the training run rotated it out just now
        return real(path, *args, **kwargs)

    monkeypatch.setattr(directory, reader, rotated_out_first)
    code, out, _err = cli("eval", config, ckpt="latest")
    assert code == 0
    assert "LOADING CHECKPOINT" in out and "latest_epoch_checkpoint_1.pt" in out


# ---- a holder on another host ----


def _noted_elsewhere(tmp_path, cli) -> Path:
    assert cli("train", _config(tmp_path))[0] == 0
    run = tmp_path / "toy"
    manifest = _manifest(run)
    manifest["state"] = "running"
    _write_manifest(run, manifest)
    note = {"pid": 4242, "host": "node-elsewhere", "command": "python -m gatle_ignite train"}
    (run / "run.lock").write_text(json.dumps(note) + "\n")
    return run


def test_status_tells_a_killed_holder_on_another_host_from_a_live_one(tmp_path, cli, capsys):
    run = _noted_elsewhere(tmp_path, cli)
    # The note survived a SIGKILL there; the lock did not.
    code, out = _status(run, capsys)
    assert code == 75 and "state:    interrupted" in out and "held by" not in out
    # The control: the same note with its lock held, as by a process alive on that host.
    with open(run / "run.lock") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        code, out = _status(run, capsys)
    assert code == 3 and "held by:  pid 4242 on node-elsewhere" in out
    assert "cannot tell" not in out


def test_status_says_when_nothing_can_tell_whether_a_remote_holder_lives(
    tmp_path, cli, capsys, monkeypatch
):
    run = _noted_elsewhere(tmp_path, cli)
    monkeypatch.setattr(lock, "fcntl", None)  # a system without flock
    code, out = _status(run, capsys)
    assert code == 3 and "held by:  pid 4242 on node-elsewhere" in out
    assert "cannot tell whether it still runs" in out


# ---- a save_dir the file system refuses ----


def test_a_save_dir_under_a_file_or_with_too_long_a_name_is_one_config_error(tmp_path, cli):
    (tmp_path / "a_file").write_text("not a directory\n")
    cases = {
        tmp_path / "a_file" / "run": "a name on its path is a file, not a directory",
        tmp_path / ("x" * 300): "a name on its path is longer than the file system allows",
    }
    for save_dir, why in cases.items():
        code, out, err = cli("train", _config(tmp_path, save_dir=str(save_dir)))
        assert code == 2 and f"cannot write save_dir {save_dir}" in err and why in err
        assert "Traceback" not in err and "TRAIN epoch" not in out


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs of its own (needs root); unmounted after the test."""
    mount = tmp_path / "fs"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_read_only_save_dir_resumes_a_finished_run_as_nothing_to_do(tmp_path, cli, small_fs):
    config = _config(tmp_path, save_dir=str(small_fs / "toy"))
    assert cli("train", config)[0] == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    code, out, err = cli("train", config, "resume=True")
    assert code == 0, err
    assert "NOTHING TO DO" in out
    code, out, err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 2 and "it is on a read-only file system" in err
    assert "Traceback" not in err and "TRAIN epoch" not in out
    assert _manifest(small_fs / "toy")["state"] == "completed"


def test_a_disk_that_fills_up_mid_run_is_one_error_and_a_failed_run(
    tmp_path, cli, capsys, small_fs
):
    # A new checkpoint every iteration, none removed: the 2 MiB fill up within the first epochs.
    config = _config(
        tmp_path, save_dir=str(small_fs / "toy"), max_epochs=10000, n_saved=None, save_every_iters=1
    )
    code, out, err = cli("train", config)
    assert code == 2 and "its file system has no space left" in err
    assert "Traceback" not in err and "TRAIN epoch" in out
    manifest = _manifest(small_fs / "toy")
    assert manifest["state"] == "failed" and "no space left" in manifest["stop_reason"]
    assert _status(small_fs / "toy", capsys)[0] == 1


def test_a_disk_filled_by_another_process_still_gets_the_runs_end_recorded(tmp_path, cli, small_fs):
    config = _config(tmp_path, save_dir=str(small_fs / "toy"), max_epochs=1)
    assert cli("train", config)[0] == 0
    with open(small_fs / "filler", "wb") as filler:
        with pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    code, _out, err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 2 and "its file system has no space left" in err
    # Refused before it recorded anything: the run is as it was, not "running".
    assert _manifest(small_fs / "toy")["state"] == "completed"


# ---- a run.json of valid JSON and wrong types ----

WRONG = {
    "trained_iteration is text": {"trained_iteration": "abc"},
    "config is a list": {"config": []},
    "a checkpoint entry is a number": {"checkpoints": [5]},
    "an entry's file is a number": {"checkpoints": [{"file": 5, "kind": "best"}]},
    "an entry names a file outside": {
        "checkpoints": [{"file": "../elsewhere.pt", "kind": "latest_epoch"}]
    },
    "accepted_changes is text": {"accepted_changes": "lr"},
    "state is unknown": {"state": "exploded"},
    "max_epochs is true": {"max_epochs": True},
}


@pytest.mark.parametrize("damage", WRONG)
def test_a_run_json_of_the_wrong_types_is_a_damaged_manifest(tmp_path, cli, capsys, damage):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    manifest = _manifest(run)
    manifest.update(WRONG[damage])
    _write_manifest(run, manifest)
    code, out = _status(run, capsys)
    assert code == 75 and "is damaged" in out and "latest_epoch_checkpoint_2.pt" in out
    with pytest.warns(UserWarning, match="rebuilding the run's index"):
        code, out, err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 0, err
    assert "TRAIN epoch 3" in out
    assert _manifest(run)["state"] == "completed" and _manifest(run)["trained_epoch"] == 3


def test_a_directory_named_run_json_is_told_not_trained_into(tmp_path, cli, capsys):
    config = _config(tmp_path)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    (run / MANIFEST_FILE).unlink()
    (run / MANIFEST_FILE).mkdir()
    # Status and resume agree: a requeue loop on status must not go round forever.
    assert main(["status", str(run)]) == 2
    assert f"{run / MANIFEST_FILE} is a directory" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="cannot be read"):
        code, out, err = cli("train", config, "resume=True", "max_epochs=3")
    assert code == 2 and f"{run / MANIFEST_FILE} is a directory" in err
    assert "TRAIN epoch" not in out and "Traceback" not in err


def test_status_of_a_damaged_run_json_without_checkpoints_is_a_config_error(tmp_path, capsys):
    run = tmp_path / "toy"
    run.mkdir()
    (run / MANIFEST_FILE).write_text('{"format": 1, "state": 3}')
    assert main(["status", str(run)]) == 2
    assert "is damaged" in capsys.readouterr().err
    assert os.listdir(run) == [MANIFEST_FILE]


def test_eval_reads_the_next_listing_when_a_whole_listing_was_rotated_out(
    tmp_path, cli, monkeypatch
):
    config = _config(tmp_path, n_saved=1)
    assert cli("train", config)[0] == 0
    run = tmp_path / "toy"
    listed = run / "latest_epoch_checkpoint_2.pt"
    replacement = run / "latest_epoch_checkpoint_3.pt"
    real = directory.load_checkpoint_file

    def rotated_while_reading(path, *args, **kwargs):
        if Path(path) == listed and listed.exists():
            # The training run writes the next epoch's file and removes the one eval listed.
            replacement.write_bytes(listed.read_bytes())
            listed.unlink()
        return real(path, *args, **kwargs)

    monkeypatch.setattr(directory, "load_checkpoint_file", rotated_while_reading)
    code, out, _err = cli("eval", config, ckpt="latest")
    assert code == 0 and f"LOADING CHECKPOINT: {replacement}" in out
