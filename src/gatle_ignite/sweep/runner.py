"""A whole sweep in this process: open (or join) its study, run its workers, say how it ended.

``SIGTERM``, ``SIGUSR1`` (SLURM's warning) or Ctrl-C stop it: no new trial starts, every running
trial is passed the signal and saves where it is (the preemption path of a run), and the sweep
exits 75. Running the same command again resumes those trials first. A second signal kills the
trials at once; they resume from their last checkpoint.
"""

import contextlib
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.launch.budget import shares
from gatle_ignite.run.storage import local_dir
from gatle_ignite.sweep.checks import Checked, refuse_if_different
from gatle_ignite.sweep.claims import scheduling
from gatle_ignite.sweep.journal import check_journal
from gatle_ignite.sweep.reconnect import StorageUnreachable
from gatle_ignite.sweep.record import RECORD_FILE, SweepRecord
from gatle_ignite.sweep.remote import publish_sweep_files, sweep_lease
from gatle_ignite.sweep.study import (
    build_pruner,
    build_sampler,
    open_storage,
    quiet_optuna,
    require_optuna,
    shown_storage,
)
from gatle_ignite.sweep.worker import SweepRun, Worker
from gatle_ignite.trainer.preemption import EXIT_PREEMPTED

__all__ = ["SweepResult", "run_sweep"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


@dataclass(frozen=True)
class SweepResult:
    """How the sweep ended: its exit code and why, its counts, and its study (None when its
    database stopped answering)."""

    exit_code: int
    message: str
    counts: dict
    study: object
    record: SweepRecord


def run_sweep(checked: Checked, say=None) -> SweepResult:
    """Run ``checked`` until its study holds ``trials`` finished trials, or it is stopped."""
    say = say or _say()
    sweep = checked.sweep
    journal = "journal" in checked.storage
    with sweep_lease(sweep.dir, journal):
        if journal:
            local_dir(sweep.dir).mkdir(parents=True, exist_ok=True)
            check_journal(checked.storage["journal"])
        # A server that cannot be reached is refused before the directory is made.
        storage = open_storage(checked.storage, sweep.storage_retry)
        local_dir(sweep.dir).mkdir(parents=True, exist_ok=True)
        try:
            study, record = _open_study(checked, storage)
        except StorageUnreachable as error:
            return SweepResult(1, _storage_lost(str(error)), {}, None, checked.record)
        publish_sweep_files(sweep.dir)
        result = _run_workers(SweepRun(_with_record(checked, record), study, say))
        publish_sweep_files(sweep.dir)
        return result


def _run_workers(run: SweepRun) -> SweepResult:
    sweep, say = run.sweep, run.say
    say(_header(run))
    workers = [Worker(run, index, share) for index, share in enumerate(shares(sweep.workers))]
    with _stop_signals(run):
        threads = [threading.Thread(target=w.loop, name=f"worker-{w.index}") for w in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
    return _result(run)


def _say():
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            sys.stdout.write(f"{line}\n")
            sys.stdout.flush()

    return say


def _with_record(checked: Checked, record: SweepRecord) -> Checked:
    return Checked(checked.sweep, checked.config_name, record, checked.storage, checked.enqueued)


def _open_study(checked: Checked, storage):
    """Create the study, or join the one this directory records; under the scheduling lock, so
    that workers started at once agree on one study."""
    optuna = require_optuna()
    sweep, asked = checked.sweep, checked.record
    sampler = build_sampler(sweep.sampler, sweep.space())
    pruner = build_pruner(sweep.pruner, sweep.pruner_params)
    here = local_dir(sweep.dir)
    with scheduling(here), quiet_optuna():
        found = SweepRecord.read(here)
        exists = _study_exists(storage, asked.study)
        if found is None and exists:
            raise ConfigError(
                f"the storage {shown_storage(checked.storage)} already holds a study named "
                f"{asked.study!r}, and {sweep.dir} has no {RECORD_FILE}: it belongs to another "
                f"sweep directory.\n"
                f"  To join that sweep, every worker must use the same --dir (a directory all "
                f"machines share); to start another, give it a new --study name."
            )
        if found is not None:
            refuse_if_different(here, found, asked)
        record = found or asked
        # What may change from one command to the next is this command's.
        for name in ("trials", "sampler", "pruner", "pruner_params"):
            setattr(record, name, getattr(asked, name))
        record.write(here)
        if exists:
            study = optuna.load_study(
                study_name=record.study, storage=storage, sampler=sampler, pruner=pruner
            )
            _refuse_foreign(study, record, checked)
            return study, record
        study = optuna.create_study(
            study_name=record.study,
            storage=storage,
            direction=record.direction,
            sampler=sampler,
            pruner=pruner,
        )
        study.set_user_attr("sweep_id", record.sweep_id)
        study.set_user_attr("metric", record.metric)
        for params in checked.enqueued:
            study.enqueue_trial(params)
        return study, record


def _study_exists(storage, name: str) -> bool:
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def _refuse_foreign(study, record: SweepRecord, checked: Checked) -> None:
    owner = study.user_attrs.get("sweep_id")
    if owner != record.sweep_id:
        raise ConfigError(
            f"the study {record.study!r} in {shown_storage(checked.storage)} belongs to another "
            f"sweep (id {owner}) than {Path(checked.sweep.dir) / RECORD_FILE} (id "
            f"{record.sweep_id}).\n  Give this sweep a new --study name, or its own --dir."
        )


def _header(run: SweepRun) -> str:
    sweep, record = run.sweep, run.record
    space = ", ".join(f"{key}={text}" for key, text in record.params.items())
    where = (
        "journal " + str(local_dir(sweep.dir) / "study.journal")
        if sweep.storage is None
        else (shown_storage(run.checked.storage))
    )
    workers = f"{sweep.workers} worker{'s' if sweep.workers > 1 else ''}"
    return (
        f"SWEEP {record.study}: {sweep.trials} trials of {sweep.config}, {record.direction} "
        f"{record.metric} over {space}\n"
        f"  in {sweep.dir}, study in {where}; sampler {sweep.sampler}, pruner {sweep.pruner}, "
        f"{workers}"
    )


@contextlib.contextmanager
def _stop_signals(run: SweepRun):
    """The first stop signal preempts every trial; a second kills them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, _frame) -> None:
        if run.signalled is not None:
            run.kill_children()
            return
        # A trial takes SIGINT as an error, so a Ctrl-C reaches it as the request to save.
        run.preempt(signum, signal.SIGTERM if signum == signal.SIGINT else signum)

    previous = {sig: signal.signal(sig, handle) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _counts(study) -> dict:
    optuna = require_optuna()
    counts = {state.name.lower(): 0 for state in optuna.trial.TrialState}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] += 1
    return counts


def _result(run: SweepRun) -> SweepResult:
    if run.storage_lost is not None:
        return SweepResult(1, _storage_lost(run.storage_lost), {}, None, run.record)
    with quiet_optuna():
        counts = _counts(run.study)
    code, message = _ending(run, counts)
    return SweepResult(code, message, counts, run.study, run.record)


def _storage_lost(reason: str) -> str:
    return (
        f"SWEEP STOPPED: {reason}.\n"
        f"  Run the same command again once it answers: it records the trials that ended "
        f"meanwhile and resumes the others."
    )


def _ending(run: SweepRun, counts: dict) -> tuple:
    """``(exit code, message)`` for how the sweep ended."""
    if run.killed:
        return 1, (
            f"{run.stop_reason}, then killed by a second signal: the running trials had no "
            f"time to save.\n  Run the same command again: they resume from their last "
            f"checkpoints."
        )
    if run.left_resumable or run.signalled is not None:
        left = ", ".join(str(n) for n in sorted(run.left_resumable)) or "none"
        finished = sum(counts[state] for state in ("complete", "pruned", "fail"))
        return EXIT_PREEMPTED, (
            f"PREEMPTED ({run.stop_reason}): {finished} of {run.sweep.trials} trials finished; "
            f"trial(s) {left} saved where they stopped.\n"
            f"  Run the same command again to resume them and go on."
        )
    if run.stop.is_set():
        return 1, f"SWEEP STOPPED: {run.stop_reason}"
    if counts["complete"] == 0:
        return 1, f"SWEEP FINISHED with no complete trial: {_tally(counts)}"
    return 0, f"SWEEP COMPLETE: {_tally(counts)}"


def _tally(counts: dict) -> str:
    shown = [f"{counts[s]} {s}" for s in ("complete", "pruned", "fail") if counts.get(s)]
    total = sum(counts.get(s, 0) for s in ("complete", "pruned", "fail"))
    return f"{total} trials finished ({', '.join(shown)})"


def best_trial(study) -> Optional[object]:
    if study is None:
        return None
    with quiet_optuna():
        try:
            return study.best_trial
        except ValueError:
            return None
