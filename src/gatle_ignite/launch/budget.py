"""The machine's share for each of several processes run at once: CPU threads and GPUs.

torch gives every process as many threads as the machine has cores, so processes started side by
side (the configs of ``train --config=a,b``, the workers of a sweep, the ranks the launcher
spawns) would each use every core and slow one another down many times over. Each gets its share
instead, as ``OMP_NUM_THREADS``, unless the user set that variable: a value the user chose stands.
The share handed down is recorded in ``GATLE_IGNITE_CPUS``, so a process given a share (a sweep's
trial) divides that share, not the machine, among the ranks it spawns.
"""

import contextlib
import os
from dataclasses import dataclass
from typing import Optional

# An attribute of this module, so tests can stand in a machine with GPUs.
import torch

__all__ = ["CPUS_VAR", "Share", "available_cpus", "ranks_share", "shares"]

CPUS_VAR = "GATLE_IGNITE_CPUS"
_THREADS_VAR = "OMP_NUM_THREADS"
_DEVICES_VAR = "CUDA_VISIBLE_DEVICES"


def available_cpus(env=None) -> int:
    """The cores this process may use: its share when it was given one, else its affinity."""
    env = os.environ if env is None else env
    given = env.get(CPUS_VAR, "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _user_set_threads(env) -> bool:
    # A share this framework handed down comes with CPUS_VAR; a bare OMP_NUM_THREADS is the user's.
    return _THREADS_VAR in env and CPUS_VAR not in env


@dataclass(frozen=True)
class Share:
    """One process's part of the machine: ``threads`` (None: the user's OMP_NUM_THREADS stands)
    and ``devices`` (a CUDA_VISIBLE_DEVICES value; None: the GPUs are left as they are)."""

    threads: Optional[int]
    devices: Optional[str] = None

    def apply(self, env: dict) -> dict:
        """``env`` with this share written into it (changed in place and returned)."""
        if self.threads is not None:
            env[_THREADS_VAR] = str(self.threads)
            env[CPUS_VAR] = str(self.threads)
        if self.devices is not None:
            env[_DEVICES_VAR] = self.devices
        return env


def _visible_gpus(env) -> list:
    listed = env.get(_DEVICES_VAR)
    if listed is not None:
        return [item.strip() for item in listed.split(",") if item.strip()]
    return [str(index) for index in range(torch.cuda.device_count())]


def _device_shares(count: int, gpus: list) -> list:
    """Contiguous, equal groups of GPUs; with fewer GPUs than processes, one each in turn."""
    if len(gpus) < 2:
        return [None] * count
    if len(gpus) < count:
        return [gpus[index % len(gpus)] for index in range(count)]
    size = len(gpus) // count
    return [",".join(gpus[index * size : (index + 1) * size]) for index in range(count)]


def shares(count: int, env=None, split_gpus: bool = True) -> list:
    """``count`` shares of this machine, for processes run at once; the first is index 0."""
    env = os.environ if env is None else env
    threads = None if _user_set_threads(env) else max(1, available_cpus(env) // count)
    devices = _device_shares(count, _visible_gpus(env)) if split_gpus else [None] * count
    return [Share(threads, device) for device in devices]


@contextlib.contextmanager
def ranks_share(nproc: int):
    """While the launcher spawns ``nproc`` ranks here: each inherits its share of the cores.

    The ranks pick their GPU by local rank, so only the threads are set.
    """
    saved = {name: os.environ.get(name) for name in (_THREADS_VAR, CPUS_VAR)}
    shares(nproc, split_gpus=False)[0].apply(os.environ)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
