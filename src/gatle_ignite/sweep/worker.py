"""A sweep's worker: take the next trial, run it as a ``train`` child, tell the study how it ended.

The next trial is an orphan first (a trial the study says is running whose claim is free: its
worker died, or the sweep was stopped), resumed from its checkpoints with ``resume=True``; else
a new one from ``study.ask()``, while fewer than N trials were ever started. Choosing is done under
the sweep's scheduling lock, so no two workers, here or on another machine, take the same trial
or start one too many. A worker with nothing to take waits while trials run elsewhere: one of
them may yet be left to resume.
"""

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Optional

from gatle_ignite.launch.budget import Share
from gatle_ignite.launch.world import WORLD_VARS
from gatle_ignite.run.storage import holder_of, is_url, local_dir, place_of
from gatle_ignite.run.sweep_trial import TRIAL_VAR
from gatle_ignite.sweep.claims import Claim, claim, scheduling
from gatle_ignite.sweep.reconnect import StorageUnreachable
from gatle_ignite.sweep.remote import publish_sweep_files
from gatle_ignite.sweep.study import finished_states, quiet_optuna, require_optuna
from gatle_ignite.sweep.trial import (
    Outcome,
    logged_scores,
    outcome_of,
    record_failure,
    train_argv,
    trial_dir,
    trial_name,
    trial_overrides,
)
from gatle_ignite.trainer.preemption import signal_name

__all__ = ["SweepRun", "Worker"]

# How often a worker with nothing to take looks again, and waits for a dead worker's child.
POLL_S = 2.0
# Not inherited by a trial: they would make it join a world this process belongs to.
_NOT_INHERITED = (
    *WORLD_VARS,
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
)
_TAIL_LINES = 20


@dataclass
class Job:
    """A trial this worker holds the claim of: new, or an orphan to resume."""

    trial_id: int
    number: int
    claim: Claim
    resume: bool
    params: dict = field(default_factory=dict)


class SweepRun:
    """What this process's workers share: the study, the stop request, the running children."""

    def __init__(self, checked, study, say):
        self.checked = checked
        self.sweep = checked.sweep
        self.record = checked.record
        self.study = study
        self.say = say
        self.stop = threading.Event()
        self.stop_reason = ""
        self.killed = False
        # The stop signal this process got, passed on to its trials; None until one comes.
        self.signalled = None
        self.left_resumable = []
        self.failures_in_row = 0
        self.last_failure = ""
        # Why the study's database was given up on (sweep.reconnect); None while it answers.
        self.storage_lost = None
        self._lock = threading.Lock()
        self._children = set()

    # ---- stopping ----

    def request_stop(self, reason: str) -> None:
        with self._lock:
            if not self.stop.is_set():
                self.stop_reason = reason
                self.stop.set()

    def lose_storage(self, error: StorageUnreachable) -> None:
        """The study's database did not answer for the retry bound: no trial starts; the ones
        running finish, and those not recorded are the next command's to record."""
        self.storage_lost = str(error)
        self.request_stop(self.storage_lost)

    def preempt(self, received: int, passed_on: int) -> None:
        """The first stop signal: no trial starts, and every running trial (and one starting
        now) gets ``passed_on``: each saves where it is and exits 75."""
        with self._lock:
            self.signalled = passed_on
            if not self.stop.is_set():
                self.stop_reason = f"stopped by {signal_name(received)}"
                self.stop.set()
            children = list(self._children)
        for child in children:
            _signal(child.pid, passed_on, group=False)

    def kill_children(self) -> None:
        """Kill every running trial and its ranks at once, with no checkpoint."""
        self.killed = True
        with self._lock:
            children = list(self._children)
        for child in children:
            _signal(child.pid, signal.SIGKILL, group=True)

    def track(self, child) -> None:
        with self._lock:
            self._children.add(child)
            signum = self.signalled
        # Started as the signal came: it is passed on all the same.
        if signum is not None:
            _signal(child.pid, signum, group=False)

    def untrack(self, child) -> None:
        with self._lock:
            self._children.discard(child)

    # ---- outcomes ----

    def count(self, outcome: Outcome, number: int) -> None:
        """Count failures in a row; past the sweep's limit the sweep stops. A diverged trial
        is no failure of the sweep: its values made the loss blow up, and the next may not."""
        with self._lock:
            if outcome.state != "failed":
                self.failures_in_row = 0
                return
            self.failures_in_row += 1
            self.last_failure = f"trial {number}: {outcome.reason}"
            limit = self.sweep.max_failures
            reached = limit and self.failures_in_row >= limit
        if reached:
            self.request_stop(
                f"{limit} trials in a row failed (--max-failures {limit}); the last, "
                f"{self.last_failure}"
            )


def _signal(pid: int, signum: int, group: bool) -> None:
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class Worker:
    """One of this process's ``--workers``: runs one trial at a time on its share."""

    def __init__(self, run: SweepRun, index: int, share: Share):
        self.run = run
        self.index = index
        self.share = share

    def loop(self) -> None:
        """Take and run trials until the study holds N finished ones or the sweep stops.

        An error of the worker's own (not a trial's: those are told to the study), or a study
        storage that stopped answering, stops the sweep; the trial it held stays running in the
        study, to be resumed.
        """
        try:
            self._loop()
        except StorageUnreachable as error:
            self.run.lose_storage(error)
        except Exception as error:
            traceback.print_exc()
            self.run.request_stop(f"worker {self.index} failed: {error!r}")

    def _loop(self) -> None:
        run = self.run
        while not run.stop.is_set():
            job = self._next()
            if job is None:
                return
            if job == "wait":
                run.stop.wait(POLL_S)
                continue
            self._run(job)

    # ---- choosing ----

    def _next(self):
        """A Job, ``"wait"`` (every trial is started, some run elsewhere) or None (done)."""
        run = self.run
        optuna = require_optuna()
        with scheduling(local_dir(run.sweep.dir)), quiet_optuna():
            trials = run.study.get_trials(deepcopy=False)
            if sum(t.state in finished_states() for t in trials) >= run.sweep.trials:
                return None
            running = sorted(
                (t for t in trials if t.state == optuna.trial.TrialState.RUNNING),
                key=lambda t: t.number,
            )
            for trial in running:
                job = self._take_orphan(trial)
                if job is not None:
                    return job
            started = sum(t.state != optuna.trial.TrialState.WAITING for t in trials)
            if started >= run.sweep.trials or run.stop.is_set():
                return "wait"
            return self._ask()

    def _take_orphan(self, trial) -> Optional[Job]:
        optuna = require_optuna()
        held_claim = claim(local_dir(self.run.sweep.dir), trial.number)
        if held_claim is None:
            return None
        # Told and released between the listing and this claim: not an orphan any more.
        if self.run.study._storage.get_trial(trial._trial_id).state != trial.state:
            held_claim.release()
            return None
        study_trial = optuna.trial.Trial(self.run.study, trial._trial_id)
        return Job(trial._trial_id, trial.number, held_claim, True, self._params(study_trial))

    def _ask(self) -> Job:
        trial = self.run.study.ask()
        held_claim = claim(local_dir(self.run.sweep.dir), trial.number)
        if held_claim is None:  # only a process that ignores the scheduling lock gets here
            raise RuntimeError(f"the claim of new trial {trial.number} is held by another process")
        trial.set_user_attr("dir", trial_name(trial.number))
        return Job(trial._trial_id, trial.number, held_claim, False, self._params(trial))

    def _params(self, trial) -> dict:
        # A resumed trial gets back the values it was given; one whose worker died before
        # drawing them all draws the rest now.
        return {param.key: param.suggest(trial) for param in self.run.sweep.params}

    # ---- running ----

    def _run(self, job: Job) -> None:
        run = self.run
        try:
            save_dir = trial_dir(run.sweep.dir, job.number)
            overrides = trial_overrides(run.sweep, run.record.study, job.number, job.params)
            shown = ", ".join(f"{k}={v!r}" for k, v in job.params.items())
            verb = "resumed" if job.resume else "started"
            run.say(f"trial {job.number} {verb}: {shown} -> {save_dir}")
            if job.resume and not self._wait_for_leftovers(job, save_dir):
                return
            code, tail = self._train(job, overrides)
            outcome = outcome_of(code, save_dir, tail)
            if outcome.state == "preempted" or (run.stop.is_set() and _stopped_by_us(run, code)):
                run.left_resumable.append(job.number)
                run.say(f"trial {job.number} preempted: resumable, it continues next time")
                if not run.stop.is_set():
                    run.request_stop(f"trial {job.number} was preempted")
                return
            if outcome.state == "failed":
                # Before the study hears it: a worker dying in between leaves the trial running
                # there, and the next sweep resumes it.
                record_failure(save_dir, outcome.reason)
            try:
                self._tell(job, outcome, save_dir)
            except StorageUnreachable:
                run.say(
                    f"trial {job.number} ended ({outcome.state}), but the study storage does not "
                    f"answer: the same command, run again, takes it up"
                )
                raise
        finally:
            job.claim.release()
            publish_sweep_files(run.sweep.dir)

    def _wait_for_leftovers(self, job: Job, save_dir) -> bool:
        """Wait until no process of a dead worker trains the trial; False when stopped first."""
        previous = job.claim.previous or {}
        child = previous.get("child")
        same_host = previous.get("host") == socket.gethostname()
        while not self.run.stop.is_set():
            alive = same_host and child is not None and _alive(child)
            if not alive and holder_of(place_of(save_dir)) is None:
                return True
            self.run.stop.wait(POLL_S / 4)
        return False

    def _train(self, job: Job, overrides: list) -> tuple:
        argv = train_argv(self.run.sweep.config, overrides, job.resume)
        child = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=self._env(job),
            # Its own session: a terminal's Ctrl-C reaches the sweep, which passes on a SIGTERM.
            start_new_session=True,
        )
        job.claim.note(child=child.pid)
        self.run.track(child)
        tail = collections.deque(maxlen=_TAIL_LINES)
        relay = threading.Thread(
            target=_relay, args=(child.stdout, trial_name(job.number), tail), daemon=True
        )
        relay.start()
        try:
            code = child.wait()
            relay.join()
        finally:
            self.run.untrack(child)
        return code, list(tail)

    def _env(self, job: Job) -> dict:
        run = self.run
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        env["PYTHONUNBUFFERED"] = "1"
        self.share.apply(env)
        env[TRIAL_VAR] = json.dumps(
            {
                "storage": run.checked.storage,
                "study": run.record.study,
                "trial_id": job.trial_id,
                "trial": job.number,
                "sweep_dir": _shown_dir(run.sweep.dir),
                "params": job.params,
                "metric": run.record.metric,
                "pruner": run.sweep.pruner,
                "pruner_params": run.sweep.pruner_params,
                "storage_retry": run.sweep.storage_retry,
            }
        )
        return env

    # ---- telling ----

    def _tell(self, job: Job, outcome: Outcome, save_dir) -> None:
        run, optuna = self.run, require_optuna()
        states = optuna.trial.TrialState
        storage = run.study._storage
        if outcome.state == "complete":
            self._report_missing_scores(job.trial_id, save_dir)
            value = self._best_reported(job.trial_id)
            if value is None:
                outcome = Outcome(
                    "failed", f"the run reported no {run.record.metric}: it never evaluated it"
                )
        with quiet_optuna():
            if outcome.state == "complete":
                run.study.tell(job.number, value)
            elif outcome.state == "pruned":
                run.study.tell(job.number, state=states.PRUNED)
            else:
                # Diverged too: Optuna fails a trial whose objective is NaN, and its samplers
                # leave failed trials out.
                storage.set_trial_user_attr(job.trial_id, "fail_reason", _fail_reason(outcome))
                run.study.tell(job.number, state=states.FAIL)
        run.say(self._told_line(job.number, outcome, storage.get_trial(job.trial_id)))
        run.count(outcome, job.number)

    def _report_missing_scores(self, trial_id: int, save_dir) -> None:
        """The scores the run logged that the study lacks: those its process could not report
        while the study's database did not answer."""
        storage = self.run.study._storage
        reported = storage.get_trial(trial_id).intermediate_values
        for epoch, value in logged_scores(save_dir, self.run.record.metric).items():
            if epoch not in reported:
                storage.set_trial_intermediate_value(trial_id, epoch, value)

    def _best_reported(self, trial_id: int) -> Optional[float]:
        values = list(self.run.study._storage.get_trial(trial_id).intermediate_values.values())
        if not values:
            return None
        return max(values) if self.run.record.direction == "maximize" else min(values)

    def _told_line(self, number: int, outcome: Outcome, frozen) -> str:
        metric = self.run.record.metric
        if outcome.state == "failed":
            return f"trial {number} failed: {outcome.reason}"
        if outcome.state == "diverged":
            return (
                f"trial {number} diverged ({outcome.reason}): a failed trial in the study, "
                f"and the sweep goes on"
            )
        value = f"{metric} {frozen.value:.5g}" if frozen.value is not None else "no score"
        if outcome.state == "pruned":
            return f"trial {number} pruned ({outcome.reason}): {value}"
        return f"trial {number} complete: {value}{self._best_so_far()}"

    def _best_so_far(self) -> str:
        try:
            best = self.run.study.best_trial
        except ValueError:
            return ""
        return f" (best so far: trial {best.number}, {best.value:.5g})"


def _shown_dir(sweep_dir) -> str:
    return sweep_dir if is_url(sweep_dir) else os.path.abspath(sweep_dir)


def _fail_reason(outcome: Outcome) -> str:
    return f"diverged: {outcome.reason}" if outcome.state == "diverged" else outcome.reason


def _stopped_by_us(run: SweepRun, code: int) -> bool:
    """A trial that ended by a signal while the sweep stopped was stopped by it: resumable."""
    return run.killed or code < 0


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True
    except (OSError, TypeError, ValueError):
        return False
    return True


def _relay(stream, prefix: str, tail) -> None:
    for line in stream:
        text = line.rstrip("\n")
        tail.append(text)
        # One write per line, so lines of concurrent trials never interleave mid-line.
        sys.stdout.write(f"[{prefix}] {text}\n")
        sys.stdout.flush()
