"""The cores a run has, against the threads torch will use on them.

torch runs each operation on ``torch.get_num_threads()`` threads, by default one per core of
the machine. Several training processes at once (ranks, configs run together, other jobs) each
take that many, and threads that outnumber the free cores spend their time waiting for one
another: a step can take several times as long. A run says so once, with the fix.
"""

import os
import warnings
from typing import Optional

import torch

__all__ = ["oversubscription", "usable_cores", "warn_if_oversubscribed"]

# Threads wanted beyond the cores, as a share of them, before it is worth a warning: a short
# burst of other work is no reason to change anything.
_TOLERATED = 0.5


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _load_average() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def oversubscription(threads: int, processes: int, cores: int, load: float) -> Optional[str]:
    """The warning for ``processes`` of ``threads`` threads each on ``cores`` cores, whose load
    average (other work's runnable threads, over the last minute) is ``load``; None when they
    fit."""
    wanted = threads * processes
    if threads <= 1 or wanted + load <= cores * (1 + _TOLERATED):
        return None
    fitting = max(1, int((cores - min(load, cores - 1)) // processes))
    who = f"{processes} processes x {threads}" if processes > 1 else f"{threads}"
    return (
        f"torch runs {who} threads on {cores} usable CPU cores (os.sched_getaffinity) with a "
        f"load average of {load:.1f} from other work: the threads wait for each other, and "
        f"each step takes longer than with fewer.\n"
        f"  Give each process {fitting}: OMP_NUM_THREADS={fitting} in the environment, or "
        f"torch.set_num_threads({fitting}) in the task."
    )


def warn_if_oversubscribed(processes: int) -> None:
    """Warn once when this process's torch threads, times the ``processes`` training on this
    machine, outnumber the cores other work leaves."""
    load = _load_average()
    if load is None:
        return
    message = oversubscription(torch.get_num_threads(), processes, usable_cores(), load)
    if message is not None:
        warnings.warn(message, stacklevel=2)
