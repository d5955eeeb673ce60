"""A run directory someone else wrote (a colleague's copy, a shared disk): what the commands read
from it never hangs, never reads outside it, costs what its files hold, and a file the run did
not write is named, never ranked or adopted.

Each hostile file goes through the real command. A command that could hang or take the
machine's memory runs in a capped child process (``run_capped``);
each case has a negative control showing the file is live (what the old code would have read).
"""

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gatle_ignite.cli.main import main
from gatle_ignite.cli.plot import runs_to_draw
from gatle_ignite.run.filesystem import RECORD_LIMIT
from gatle_ignite.run.layout import CONFIG_FILE, LOCK_FILE, MANIFEST_FILE, parse_checkpoint_name
from gatle_ignite.run.manifest import Manifest
from tests.conftest import HANG_S, ROOT, child_env, run_capped
from tests.toy.config import toy_config
from tests.toy.config_file import write_toy_config
from tests.toy.trainer import Trainer

# Scored 2.0, above any accuracy, and at epoch 99: ranked first by its name alone.
PLANTED = "valid_best_result_checkpoint_99_2.0000.pt"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A finished toy run (2 epochs), copied by each test that changes it."""
    save_dir = tmp_path_factory.mktemp("template") / "run"
    Trainer(0, toy_config(save_dir=str(save_dir))).fit()
    return save_dir


@pytest.fixture
def run(template, tmp_path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "run", symlinks=True))


def _manifest(save_dir) -> dict:
    return json.loads((Path(save_dir) / MANIFEST_FILE).read_text())


def _guarded(*commands: list) -> list:
    """Run ``gatle-ignite`` commands one after another in one capped child process; returns
    ``(exit code, stdout, stderr)`` for each."""
    script = (
        "import contextlib, io, json, sys\n"
        "from gatle_ignite.cli.main import main\n"
        "results = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        code = main(argv)\n"
        "    results.append([code, out.getvalue(), err.getvalue()])\n"
        "print(json.dumps(results))\n"
    )
    argv = json.dumps([list(map(str, command)) for command in commands])
    done = run_capped([sys.executable, "-c", script, argv])
    assert done.returncode == 0, done.stderr[-3000:]
    return [tuple(result) for result in json.loads(done.stdout.splitlines()[-1])]


# ---- run.json, run.lock and config.json that are no regular file of the run ----


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _link_to(path: Path, target) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def _other_runs_manifest(tmp_path) -> Path:
    """A valid run.json of another run, outside the run directory."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    manifest = _manifest(tmp_path / "run") | {"name": "someone-elses", "run_id": "0123456789ab"}
    (other / MANIFEST_FILE).write_text(json.dumps(manifest))
    return other / MANIFEST_FILE


def _padded(path: Path) -> None:
    """Still valid JSON, grown past the bound on a record."""
    path.write_text(path.read_text() + " " * (RECORD_LIMIT + 1))


RECORDS = {
    "fifo": (_fifo, "it is a named pipe (FIFO), not a regular file"),
    "dev-zero": (lambda path: _link_to(path, "/dev/zero"), "symbolic link to /dev/zero, outside"),
    "link-out": (
        lambda path: _link_to(path, _other_runs_manifest(path.parent.parent)),
        "elsewhere/run.json, outside",
    ),
    "too-large": (_padded, f"more than the {RECORD_LIMIT >> 20} MiB read of such a file"),
}


@pytest.mark.parametrize("kind", list(RECORDS))
def test_a_run_json_that_is_no_regular_file_of_the_run_is_a_damaged_manifest(run, kind):
    """status says so (exit 75: a resume rebuilds it) and runs shows the run as unknown; neither
    waits on a FIFO, reads /dev/zero, follows a link out, or reads an oversized file."""
    change, why = RECORDS[kind]
    change(run / MANIFEST_FILE)
    (status, status_out, _), (runs, runs_out, runs_err) = _guarded(
        ["status", run], ["runs", run, "--csv"]
    )
    assert status == 75
    assert f"state:    unknown: {run / MANIFEST_FILE} is damaged (" in status_out
    assert why in status_out and "someone-elses" not in status_out
    assert runs == 0 and "cannot be read" in runs_err and why in runs_err
    row = next(csv.DictReader(io.StringIO(runs_out)))
    assert row["state"] == "unknown" and row["run"] != "someone-elses"


def test_the_linked_and_padded_manifests_are_valid_ones(run, tmp_path):
    """The negative control: what the link leads to, and the padded file, are manifests the
    reader accepts when read as ordinary files."""
    target = _other_runs_manifest(tmp_path)
    assert Manifest.read(target.parent).name == "someone-elses"
    _padded(run / MANIFEST_FILE)
    assert json.loads((run / MANIFEST_FILE).read_text())["name"] == "toy"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_lock_file_or_config_that_is_no_regular_file_is_never_read(run, kind):
    """run.lock (read for the holder's note by status and runs) and config.json (read by runs
    for a run without run.json, a 0.4 one, and by status for one whose run.json is damaged)."""
    change = RECORDS[kind][0]
    older = Path(shutil.copytree(run, run.parent / "run04"))
    (older / MANIFEST_FILE).unlink()
    change(older / CONFIG_FILE)
    # A damaged run.json: status then reads config.json for how the scores were made.
    damaged = Path(shutil.copytree(run, run.parent / "damaged"))
    (damaged / MANIFEST_FILE).write_text("{")
    change(damaged / CONFIG_FILE)
    change(run / LOCK_FILE)
    (status, status_out, _), (runs, runs_out, runs_err), (rebuilt, rebuilt_out, _) = _guarded(
        ["status", run], ["runs", older, "--csv"], ["status", damaged]
    )
    assert status == 0 and "state:    completed" in status_out and "held by" not in status_out
    assert runs == 0 and f"{older / CONFIG_FILE} cannot be read" in runs_err
    assert next(csv.DictReader(io.StringIO(runs_out)))["state"] == "unknown"
    assert rebuilt == 75 and "latest_epoch_checkpoint_2.pt" in rebuilt_out


@pytest.mark.parametrize("kind", ["fifo", "link-out"])
def test_plot_never_reads_a_metrics_history_that_is_no_regular_file_of_the_run(run, tmp_path, kind):
    history = run / "metrics.csv"
    if kind == "link-out":
        outside = tmp_path / "someone-elses.csv"
        shutil.copy(history, outside)
        _link_to(history, outside)
    else:
        RECORDS[kind][0](history)
    out = tmp_path / "plot.png"
    ((code, _out, err),) = _guarded(["plot", run, "--out", out])
    assert code == 2 and not out.exists()
    if kind == "link-out":
        assert f"{history} cannot be read as a metrics history: it is a symbolic link" in err
    else:
        assert f"{run} has no metrics.csv" in err


def test_plot_never_waits_on_a_sweeps_journal_that_is_a_fifo(template, tmp_path):
    pytest.importorskip("optuna")
    from gatle_ignite.sweep.record import SweepRecord

    sweep = tmp_path / "sweep"
    shutil.copytree(template, sweep / "trials" / "000")
    fields = {"study": "toy", "storage": str(sweep / "study.journal"), "config": "toy.py"}
    fields.update(config_fingerprint="0", overrides=[], params={}, metric="valid/acc")
    fields.update(direction="maximize", trials=1, sampler="tpe", pruner="none")
    SweepRecord.new(**fields).write(sweep)
    _fifo(sweep / "study.journal")
    ((code, _out, err),) = _guarded(["plot", sweep, "--out", tmp_path / "plot.png"])
    assert code == 2
    assert f"journal {sweep / 'study.journal'} cannot be read: it is a named pipe (FIFO)" in err


# ---- a checkpoint file the run did not write ----


def _real_best(save_dir) -> dict:
    bests = [e for e in _manifest(save_dir)["checkpoints"] if e["kind"] == "best"]
    return max(bests, key=lambda entry: entry["score"])


@pytest.fixture
def two_runs(template, tmp_path) -> tuple:
    """The template run and one with another learning rate, worse first by their real best
    scores."""
    other = tmp_path / "other"
    Trainer(0, toy_config(save_dir=str(other), optimizer_params={"lr": 0.1})).fit()
    runs = [Path(shutil.copytree(template, tmp_path / "run")), other]
    runs.sort(key=lambda save_dir: _real_best(save_dir)["score"])
    assert _real_best(runs[0])["score"] < _real_best(runs[1])["score"]
    return tuple(runs)


def _plant_best(save_dir: Path) -> Path:
    planted = save_dir / PLANTED
    planted.write_bytes(b"")
    # The negative control: by its name it outranks every real best file.
    assert parse_checkpoint_name(PLANTED).score > _real_best(save_dir)["score"]
    return planted


def _warned(argv: list) -> tuple:
    """``main(argv)`` in-process, and the text of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(list(map(str, argv)))
    return code, "\n".join(str(warning.message) for warning in caught)


def test_runs_status_and_plot_best_rank_only_what_the_run_indexed(two_runs, tmp_path, capsys):
    worse, better = two_runs
    _plant_best(worse)
    capsys.readouterr()
    code, said = _warned(["runs", worse, better, "--csv"])
    assert code == 0
    assert f"{worse}: 1 checkpoint file(s) its run.json does not index, so not ranked: " in said
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["path"] for row in rows] == [str(better), str(worse)]
    assert float(rows[1]["score"]) == pytest.approx(_real_best(worse)["score"], abs=1e-4)
    assert main(["status", str(worse)]) == 0
    out = capsys.readouterr().out
    assert "not indexed: 1 file(s) the run did not record in run.json, never ranked" in out
    assert f"\n  {PLANTED}\n" in out
    assert runs_to_draw([str(worse), str(better)], best=1)[0] == [better]
    assert (
        main(["plot", str(worse), str(better), "--best", "1", "--out", str(tmp_path / "p.png")])
        == 0
    )


def test_a_planted_best_file_is_not_adopted_and_the_real_best_stays_the_best(run, tmp_path, cli):
    """Resumed with a planted best file, the run indexes only what it writes, saves its real
    best files as ever, and eval --ckpt best loads the real one."""
    planted = _plant_best(run)
    config = write_toy_config(tmp_path / "toy.py", save_dir=str(run), max_epochs=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, _err = cli("train", config, "resume=True")
    assert code == 0 and "TRAIN epoch 3" in out
    said = "\n".join(str(warning.message) for warning in caught)
    assert f"{planted} is no checkpoint of run" in said
    assert "it does not load (the file is empty)" in said
    indexed = {entry["file"] for entry in _manifest(run)["checkpoints"]}
    assert PLANTED not in indexed and planted.exists()
    best = _real_best(run)["file"]
    code, out, _err = cli("eval", config, ckpt="best")
    assert code == 0 and f"LOADING CHECKPOINT: {run / best}" in out


def test_a_checkpoint_copied_from_another_run_is_not_resumed_from(template, tmp_path, cli):
    """A valid checkpoint, trained further, but by another run (its own id inside)."""
    run = Path(shutil.copytree(template, tmp_path / "run"))
    further = tmp_path / "further"
    Trainer(0, toy_config(save_dir=str(further), max_epochs=3)).fit()
    copied = run / "latest_epoch_checkpoint_5.pt"
    shutil.copy(further / "latest_epoch_checkpoint_3.pt", copied)
    config = write_toy_config(tmp_path / "toy.py", save_dir=str(run), max_epochs=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, _err = cli("train", config, "resume=True")
    assert code == 0
    assert f"RESUMING FROM: {run / 'latest_epoch_checkpoint_2.pt'}" in out
    said = "\n".join(str(warning.message) for warning in caught)
    assert f"{copied} is no checkpoint of run" in said
    assert f"it records run {_manifest(further)['run_id']}" in said


# ---- what run.json says, shown escaped ----

EVIL_NAME = "evil\x1b[2J"
EVIL_REASON = "boom\nstate:    completed"


@pytest.fixture
def evil(run, tmp_path) -> Path:
    """The run, in a directory whose name sets the terminal's title, with a run.json whose
    name clears the screen and whose stop reason forges a line."""
    manifest = _manifest(run) | {"name": EVIL_NAME, "state": "failed", "stop_reason": EVIL_REASON}
    (run / MANIFEST_FILE).write_text(json.dumps(manifest))
    # The negative control: the manifest is valid, and holds the characters as they are.
    assert Manifest.read(run).stop_reason == EVIL_REASON
    evil_dir = tmp_path / "run\x1b]0;pwned\x07"
    run.rename(evil_dir)
    return evil_dir


def _no_control_characters(text: str) -> bool:
    return not any(ord(char) < 32 and char != "\n" for char in text)


def test_status_shows_what_run_json_holds_escaped(evil, capsys):
    assert main(["status", str(evil)]) == 1
    out = capsys.readouterr().out
    assert _no_control_characters(out)
    assert "run:      evil\\x1b[2J (id " in out and "run\\x1b]0;pwned\\x07" in out
    assert "state:    failed (boom\\nstate:    completed)" in out
    assert not any(line.startswith("state:    completed") for line in out.splitlines())


@pytest.mark.parametrize("as_csv", [False, True], ids=["table", "csv"])
def test_runs_shows_what_run_json_holds_escaped(evil, capsys, as_csv):
    # The table shows the runs' paths under --all.
    assert main(["runs", str(evil), "--csv" if as_csv else "--all"]) == 0
    out = capsys.readouterr().out
    assert _no_control_characters(out)
    assert "evil\\x1b[2J" in out and "run\\x1b]0;pwned\\x07" in out
    if as_csv:
        (row,) = csv.DictReader(io.StringIO(out))
        assert row["run"] == "evil\\x1b[2J" and row["path"].endswith("run\\x1b]0;pwned\\x07")


# ---- a reader that goes away ----


@pytest.mark.parametrize("command", ["runs", "status"])
def test_output_into_a_closed_pipe_ends_quietly_as_a_unix_tool_does(run, command):
    """``gatle-ignite runs DIR | head -1``, with head gone before anything is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gatle_ignite", command, str(run)],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.close()  # no reader left: the first write fails with EPIPE
    err = process.stderr.read()
    assert process.wait(timeout=HANG_S) == 128 + signal.SIGPIPE
    assert "Traceback" not in err and "BrokenPipeError" not in err
