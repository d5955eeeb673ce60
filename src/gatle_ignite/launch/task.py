"""What every rank runs: the config's Trainer, trained, evaluated, or handed to a tool's job."""

import contextlib
import gc
import os
import re
import sys
from collections.abc import Callable
from typing import Optional

import ignite.distributed as idist
import torch
from ml_collections import config_dict

from gatle_ignite.dispatch import ConfigError, import_entrypoint, report_config_error
from gatle_ignite.launch.ranks import EXIT_CONFIG_ERROR, EXIT_PEER_TIMEOUT, MARKS_DIR_VAR, RankMarks
from gatle_ignite.trainer.preemption import EXIT_INTERRUPTED
from gatle_ignite.utils.warning_lines import show_framework_warnings_plainly

__all__ = ["peer_timeout_reported", "run_task"]

# What gloo and NCCL say when a collective outlives the process group's timeout.
_COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting|collective operation timeout")


def run_task(local_rank: int, cfg: config_dict.ConfigDict, job: Optional[Callable] = None):
    """Build the config's ``Trainer`` and train it, or only evaluate it in inference mode.

    ``job(trainer)``, when given, runs instead of both: a tool such as ``predict``. Returns the
    task (what ``fit()`` returns), or the job's result, on every rank; under DDP the task's
    ``model`` is then the unwrapped module.
    """
    if os.environ.get(MARKS_DIR_VAR) is not None:
        show_framework_warnings_plainly()  # a rank the CLI spawned, as the CLI shows them
    Trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    task = Trainer(local_rank, cfg)
    with peer_timeout_reported(cfg):
        result = _run_and_mark(task, cfg, local_rank, job)
        if idist.get_world_size() > 1:
            _release_process_group(task)
            # ignite destroys each rank's process group as soon as it returns; a rank that gets
            # there first tears down connections a peer is still using, and gloo aborts it.
            idist.barrier()
    return result


def _run_and_mark(task, cfg: config_dict.ConfigDict, local_rank: int, job=None):
    try:
        if job is not None:
            result = job(task)
        elif "run" in cfg:
            task.evaluate()
            result = task
        else:
            result = task.fit()
    except KeyboardInterrupt:
        if os.environ.get(MARKS_DIR_VAR) is None:
            raise  # this process is the CLI's: it reports the interruption
        # Ctrl-C before training: torch's spawn wrapper would end the rank as a success.
        raise SystemExit(EXIT_INTERRUPTED) from None
    except ConfigError as error:
        if os.environ.get(MARKS_DIR_VAR) is None:
            raise  # this process is the CLI's: it reports the error
        # A spawned rank: torch would print its traceback; the fix is what the user needs.
        RankMarks.leave("config_error", local_rank)
        if idist.get_rank() == 0:
            report_config_error(error)
        raise SystemExit(EXIT_CONFIG_ERROR) from None
    RankMarks.leave("finished", local_rank)
    return result


def _release_process_group(task) -> None:
    """Unwrap the task's DDP model and strip the wrapper of what holds the process group.

    Freed only in a garbage collection after ignite destroyed the group, the wrapper's hold
    made gloo abort the rank. Checkpoint handlers keep the wrapper itself, so unwrapping alone
    would not free it.
    """
    model = getattr(task, "model", None)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        task.model = model.module
        for name in ("reducer", "logger", "process_group"):
            model.__dict__.pop(name, None)
    # Garbage that still holds the group (a wrapper in a reference cycle) goes now, while every
    # peer is connected.
    gc.collect()


@contextlib.contextmanager
def peer_timeout_reported(cfg: config_dict.ConfigDict):
    """End the process with one message on stderr and ``EXIT_PEER_TIMEOUT`` when a collective
    timed out."""
    try:
        yield
    except RuntimeError as error:
        if not _COLLECTIVE_TIMEOUT.search(str(error)):
            raise
        print(_peer_timeout_message(cfg), file=sys.stderr, flush=True)
        sys.stdout.flush()
        # A group whose collective timed out cannot be torn down: gloo aborts the process in
        # its destructors. The trainer closed its backends when the error left fit().
        os._exit(EXIT_PEER_TIMEOUT)


def _peer_timeout_message(cfg: config_dict.ConfigDict) -> str:
    seconds = cfg.get("dist_timeout", None)
    limit = f"dist_timeout={seconds} s" if seconds else "torch's default (dist_timeout unset)"
    return (
        f"distributed timeout: rank {idist.get_rank()} waited more than {limit} for its peers "
        f"in a collective: a peer is stalled or dead, so the run stops "
        f"(exit code {EXIT_PEER_TIMEOUT}).\n"
        f"  Raise dist_timeout if a rank can legitimately work alone that long (a long "
        f"evaluation or checkpoint write on one rank); --override resume=True continues from "
        f"the last checkpoint."
    )
