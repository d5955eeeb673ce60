"""Sweeps whose study storage fails under them: a PostgreSQL server restarted mid-trial, one
down for longer than the sweep waits, a journal whose last record a crash cut short, and one
damaged inside.

Each breaks the real thing (``pg_ctl stop``, a truncated file) while a real sweep runs, and
checks what a user sees: the exit code, the lines printed, the study and the trials' runs.
"""

import fcntl
import json
import os
import signal

import pytest

from tests.conftest import HANG_S
from tests.test_sweep_runs import (
    GOOD_LR,
    Output,
    _argv,
    _config,
    _count,
    _manifest,
    _ran,
    _start,
    _states,
    _study,
    _trial_dir,
    _wait_for,
)

optuna = pytest.importorskip("optuna", reason="the sweep extra is not installed")

pytestmark = pytest.mark.slow

LR = f"--param=optimizer_params.lr=[{GOOD_LR}]"
WAITING = "does not answer"


def _rdb(url: str):
    return optuna.storages.RDBStorage(url.replace("postgresql://", "postgresql+psycopg://"))


def _until_printed(sweep: Output, pattern: str, what: str) -> None:
    """Wait until the sweep prints a line matching ``pattern``; it must not end first."""
    _wait_for(lambda: sweep.has(pattern) or sweep.process.poll() is not None, what)
    if not sweep.has(pattern):
        out = sweep.text()  # it ended: all it printed is read
        assert sweep.has(pattern), f"the sweep ended before {what}:\n" + out[-4000:]


def _trial_process(sweep_dir, number: int) -> int:
    """The pid of the process training trial ``number``, as its worker noted in its claim."""
    note = (sweep_dir / "locks" / f"trial_{number:04d}.lock").read_text()
    return json.loads(note)["child"]


def _stop_server_while_trial_0_waits(sweep: Output, sweep_dir, server) -> None:
    """Stop the server while trial 0 is held between two iterations of its first epoch, so that
    its first report (at the epoch's end) meets a stopped server, however loaded the machine."""
    _until_printed(sweep, r"^\[trial_0000\] .* TRAIN epoch 1: 2/4", "trial 0 training")
    child = _trial_process(sweep_dir, 0)
    os.kill(child, signal.SIGSTOP)
    try:
        server.stop_server()
    finally:
        os.kill(child, signal.SIGCONT)


def test_a_postgresql_restart_mid_trial_is_waited_out_and_every_trial_completes(tmp_path, postgres):
    url = postgres.create_database("restart")
    config, sweep_dir = _config(tmp_path, iter_sleep_s=0.2), tmp_path / "sweep"
    sweep = Output(_start(_argv(config, sweep_dir, "--trials=2", f"--storage={url}", LR)))
    _stop_server_while_trial_0_waits(sweep, sweep_dir, postgres)
    _until_printed(sweep, f"sweep: the study storage .* {WAITING}", "a report waiting")
    postgres.start_server()

    assert sweep.process.wait(timeout=HANG_S) == 0, sweep.text()[-4000:]
    out = sweep.text()
    assert "Traceback" not in out and "StorageInternalError" not in out, out[-4000:]
    assert "[trial_0000] sweep: the study storage " in out
    assert "answers again, after " in out
    assert _count(out, "trial 0 complete: ") == 1 and _count(out, "trial 1 complete: ") == 1
    study = _study(sweep_dir, _rdb(url))
    assert _states(study) == [(0, "COMPLETE"), (1, "COMPLETE")]
    # Every epoch's score reached the study, the one reported across the restart included.
    assert [sorted(trial.intermediate_values) for trial in study.trials] == [[1, 2, 3]] * 2


def test_a_postgresql_down_past_the_bound_stops_the_sweep_in_one_line_and_loses_no_trial(
    tmp_path, postgres
):
    url = postgres.create_database("outage")
    config, sweep_dir = _config(tmp_path, iter_sleep_s=0.2), tmp_path / "sweep"
    argv = _argv(config, sweep_dir, "--trials=2", f"--storage={url}", "--storage-retry=3", LR)
    sweep = Output(_start(argv))
    _stop_server_while_trial_0_waits(sweep, sweep_dir, postgres)

    assert sweep.process.wait(timeout=HANG_S) == 1, sweep.text()[-4000:]
    out = sweep.text()
    assert "Traceback" not in out, out[-4000:]
    stopped = [line for line in out.splitlines() if line.startswith("SWEEP STOPPED: ")]
    assert len(stopped) == 1 and stopped[0].startswith(
        "SWEEP STOPPED: the study storage postgresql+psycopg://"
    )
    assert "did not answer for 3 s (" in stopped[0]
    # The trial trained on without the storage, to its end: its training was not failed for it.
    assert "[trial_0000] sweep: the study storage " in out and "trains on without" in out
    assert _manifest(_trial_dir(sweep_dir, 0))["state"] == "completed"
    assert "trial 0 ended (complete), but the study storage does not answer" in out

    postgres.start_server()
    assert _states(_study(sweep_dir, _rdb(url))) == [(0, "RUNNING")]  # not FAIL: resumable
    again = _ran(argv).stdout
    assert _count(again, "trial 0 resumed") == 1 and _count(again, "trial 1 started") == 1
    study = _study(sweep_dir, _rdb(url))
    assert _states(study) == [(0, "COMPLETE"), (1, "COMPLETE")]
    # The scores trial 0 could not report were recorded from its metrics.csv.
    assert sorted(study.trials[0].intermediate_values) == [1, 2, 3]
    assert study.trials[0].value == max(study.trials[0].intermediate_values.values())


def _cut_last_record(journal, keep_bytes_off: int = 20) -> bytes:
    """Cut the journal's last record short, as a process killed while appending it leaves it;
    returns the part left behind."""
    data = journal.read_bytes()
    cut = data[:-keep_bytes_off]
    journal.write_bytes(cut)
    return cut[cut.rindex(b"\n") + 1 :]


def _waiting_for_lock(path) -> bool:
    """Whether a process waits for an flock on ``path`` (Linux's /proc/locks marks it ->)."""
    inode = f":{os.stat(path).st_ino} "
    return any("->" in line and inode in line for line in open("/proc/locks"))


def test_a_journal_record_cut_short_by_a_crash_is_set_aside_and_the_sweep_goes_on(tmp_path):
    config, sweep_dir = _config(tmp_path, max_epochs=1), tmp_path / "sweep"
    journal = sweep_dir / "study.journal"
    argv = _argv(config, sweep_dir, "--trials=1", LR)
    _ran(argv)
    torn = _cut_last_record(journal)
    # The negative control: Optuna's own backend appends onto the cut record, and the study can
    # no longer be read.
    wedged = tmp_path / "wedged.journal"
    wedged.write_bytes(journal.read_bytes())
    plain = optuna.storages.journal.JournalFileBackend(str(wedged))
    plain.append_logs([{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}])
    plain.append_logs([{"op_code": 0, "worker_id": "w", "study_name": "t", "directions": [1]}])
    with pytest.raises(json.JSONDecodeError):
        list(optuna.storages.journal.JournalFileBackend(str(wedged)).read_logs(0))

    # Another process holds the journal's lock: the sweep repairs nothing until it is free.
    lock, aside = sweep_dir / "locks" / "journal.lock", sweep_dir / "study.journal.torn"
    with open(lock, "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        sweep = Output(_start(_argv(config, sweep_dir, "--trials=2", LR)))
        _wait_for(
            lambda: _waiting_for_lock(lock) or sweep.process.poll() is not None,
            "the sweep waiting for the journal's lock",
        )
        assert sweep.process.poll() is None, "it went on without the lock:\n" + sweep.text()
        assert journal.read_bytes().endswith(torn) and not aside.exists()
    assert sweep.process.wait(timeout=HANG_S) == 0, sweep.text()[-4000:]
    out = sweep.text()
    warned = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warned == [
        f"warning: {journal} ended in a record cut short ({len(torn)} bytes: a process died "
        f"writing it); it is set aside in {journal}.torn, and the study goes on from the record "
        f"before it."
    ]
    assert aside.read_bytes() == torn + b"\n"
    assert "Traceback" not in out
    # The cut record was trial 0's end: it is resumed (its run has nothing left to train) and
    # recorded again.
    assert _count(out, "trial 0 resumed") == 1 and _count(out, "trial 1 started") == 1
    assert _states(_study(sweep_dir)) == [(0, "COMPLETE"), (1, "COMPLETE")]
    # Not wedged: every later command reads the study and appends to it.
    again = _ran(_argv(config, sweep_dir, "--trials=3", LR))
    # (Other warnings may come, such as torch's threads on a busy machine: not the journal's.)
    assert "cut short" not in again.stdout + again.stderr
    assert _states(_study(sweep_dir)) == [(n, "COMPLETE") for n in range(3)]


def test_a_damaged_line_inside_the_journal_is_a_config_error_naming_it(tmp_path):
    config, sweep_dir = _config(tmp_path, max_epochs=1), tmp_path / "sweep"
    journal = sweep_dir / "study.journal"
    argv = _argv(config, sweep_dir, "--trials=1", LR)
    _ran(argv)
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2][:30] + b"\n"  # a record cut short, another written after it
    journal.write_bytes(b"".join(lines))
    before = journal.read_bytes()
    done = _ran(_argv(config, sweep_dir, "--trials=2", LR), expect=2)
    assert f"config error: {journal}, line 3, is not JSON (" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "SWEEP" not in done.stdout
    assert journal.read_bytes() == before  # nothing repaired, nothing lost
