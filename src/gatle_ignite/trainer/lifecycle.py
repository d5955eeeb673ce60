"""How a training run ends, as its backends and its run directory record it.

``fit()`` runs inside :func:`recorded_run`: whatever ends the run (completion, an early stop,
divergence, preemption, a crash), a checkpoint still being written is waited for, every backend
is finished (as failed after an exception), and ``run.json`` gets the run's state and the lock
is released.
"""

import contextlib
import warnings

from gatle_ignite.trainer.preemption import Preempted

__all__ = ["outcome", "recorded_run", "settle_writes"]


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
    return "failed", f"{type(error).__name__}: {first_line}"


@contextlib.contextmanager
def recorded_run(trainer):
    """Around a training run: its end recorded in the backends and the run directory."""
    try:
        yield
    except BaseException as error:
        # Mark the run failed (a crash in setup too, once backends exist), or the loggers
        # record it as a clean finish.
        try:
            settle_writes(trainer, quietly=True)
            trainer.teardown(failed=True)
        finally:
            # Preempted, it saved where it stopped; failed, the iteration it stopped in never
            # finished, so its progress stays what its checkpoints hold.
            state, reason = _interrupted(error)
            engine = trainer.engines.get("trainer") if state == "preempted" else None
            trainer.run_dir.close(state, reason, trainer=engine)
        raise
    try:
        settle_writes(trainer)
        trainer.teardown()
    finally:
        trainer.run_dir.close(*outcome(trainer), trainer=trainer.engines["trainer"])
