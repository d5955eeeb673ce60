"""How a training run ends, as its backends and its run directory record it.

``fit()`` runs inside :func:`recorded_run`: whatever ends the run (completion, an early stop,
divergence, preemption, an interruption, a crash), a checkpoint still being written is waited
for, ``run.json`` gets the run's state, every backend is finished (as failed after an
exception), and the lock is released. The state is recorded before the backends finish, since
finishing one can take seconds (a W&B or MLflow upload) and a process killed then must not leave
its run "running".
"""

import contextlib
import warnings

from gatle_ignite.trainer.first_failure import first_failure
from gatle_ignite.trainer.preemption import Interrupted, Preempted
from gatle_ignite.utils.dist import rank_zero_print

__all__ = ["EXIT_DIVERGED", "outcome", "recorded_run", "settle_writes"]

# sysexits' EX_DATAERR: the run's settings or data made its loss or score non-finite. Not 75
# (a requeue would diverge again) and not 1 (nothing crashed): `gatle-ignite train` and
# `status` exit with it for a diverged run, while a script's fit() returns as 0.4's did.
EXIT_DIVERGED = 65


def settle_writes(trainer, quietly: bool = False) -> None:
    """Wait for a checkpoint still being written in the background (``async_save``)."""
    if trainer._writes is None:
        return
    try:
        trainer._writes.wait()
    except Exception as error:
        if not quietly:
            raise
        warnings.warn(f"the last checkpoint write failed: {error!r}", stacklevel=2)


def _stop_telemetry(trainer, quietly: bool = False) -> None:
    """Stop a profiler still recording (its trace is written)."""
    telemetry = getattr(trainer, "_telemetry", None)
    if telemetry is None:
        return
    try:
        telemetry.close()
    except Exception as error:
        if not quietly:
            raise
        warnings.warn(f"the profiler did not stop cleanly: {error!r}", stacklevel=2)


def outcome(trainer) -> tuple:
    """``(state, reason)`` of a run whose engine returned."""
    state = trainer.engines["trainer"].state
    check = trainer._nan_check
    if check is not None and check.stopped:
        return "diverged", f"non-finite loss at iteration {check.first_bad}"
    if trainer._diverged:
        return "diverged", f"non-finite score at epoch {state.epoch}"
    trial = getattr(trainer, "_sweep_trial", None)
    if trial is not None and trial.pruned:
        return "pruned", trial.reason
    for stopper in trainer._early_stoppers.values():
        if stopper.stopped:
            return "early-stopped", stopper.reason()
    if state.epoch < trainer.cfg.max_epochs:
        return "completed", f"terminated at epoch {state.epoch}"
    return "completed", ""


def _interrupted(error) -> tuple:
    first_line = next(iter(str(error).splitlines()), "")
    if isinstance(error, Preempted):
        return "preempted", first_line
    if isinstance(error, Interrupted):
        # Resumable from the checkpoints written before; nothing marks where it stopped.
        return "interrupted", first_line
    return "failed", f"{type(error).__name__}: {first_line}"


@contextlib.contextmanager
def recorded_run(trainer):
    """Around a training run: its end recorded in the run directory, then in the backends."""
    try:
        try:
            yield
            _stop_telemetry(trainer)
            settle_writes(trainer)
        except BaseException as error:
            _record_failure(trainer, error)
            raise
        try:
            trainer.run_dir.record_end(*outcome(trainer), trainer=trainer.engines["trainer"])
        finally:
            trainer.teardown()
    finally:
        trainer.run_dir.release()


def _record_failure(trainer, error) -> None:
    """Record how a run that raised ended, then finish its backends as failed (or the loggers
    record it as a clean finish)."""
    _stop_telemetry(trainer, quietly=True)
    settle_writes(trainer, quietly=True)
    state, reason = _interrupted(error)
    if state == "failed":
        # Under several ranks, the rank that failed first, not a peer's symptom of it.
        reason = first_failure(reason, str(trainer.cfg.save_dir))
    # Preempted, it saved where it stopped; failed, the iteration it stopped in never finished,
    # so its progress stays what its checkpoints hold.
    engine = trainer.engines.get("trainer") if state == "preempted" else None
    try:
        trainer.run_dir.record_end(state, reason, trainer=engine)
    except Exception as failure:
        # The error that ended the run is the one to raise; this one is only told.
        warnings.warn(
            f"run.json could not record how the run ended ({state}: {failure}); "
            f"`gatle-ignite status` calls it interrupted.",
            stacklevel=3,
        )
    if isinstance(error, Interrupted):
        rank_zero_print(error.message, flush=True)
    trainer.teardown(failed=True)
