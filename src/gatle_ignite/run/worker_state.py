"""The state of each DataLoader worker, so a resume restores it instead of replaying the data.

A worker draws the random numbers of its augmentations from its own generators, and an iterable
dataset keeps its position in the worker's copy. Each batch a worker makes comes back with what
that worker's state was right after making it; a resumed worker starts from the state its
predecessor had before the batch it is to make next, and loads nothing twice.
"""

import random
import struct
from typing import Optional

import numpy as np
import torch
from torch.utils.data import get_worker_info

__all__ = [
    "Reported",
    "ReportingCollate",
    "RestoringInit",
    "WorkerReport",
    "has_state",
    "python_random_state",
    "restore_python_random_state",
    "restore_random_state",
    "take_random_state",
]


def has_state(dataset) -> bool:
    """Whether a dataset keeps state of its own (a position, a generator) it can hand over."""
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


def python_random_state() -> tuple:
    """Python's global random state, its 625 numbers (each below 2**32) as one bytes object:
    a checkpoint or a worker's report then pickles one object where it pickled 625."""
    version, internal, gauss = random.getstate()
    return version, struct.pack(f"={len(internal)}I", *internal), gauss


def restore_python_random_state(state) -> None:
    """Set Python's global random state from ``python_random_state()`` or, as a checkpoint
    before it saved it, ``random.getstate()`` (its numbers as a sequence)."""
    version, internal, gauss = state
    if isinstance(internal, bytes):
        internal = struct.unpack(f"={len(internal) // 4}I", internal)
    random.setstate((version, tuple(internal), gauss))


def take_random_state() -> dict:
    """This process's global random state, in plain values ``torch.load(weights_only=True)``
    reads back."""
    _kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": python_random_state(),
        "numpy": (keys.tobytes(), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state().numpy().tobytes(),
    }


def restore_random_state(state: dict) -> None:
    restore_python_random_state(state["python"])
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(
        ("MT19937", np.frombuffer(keys, dtype=np.uint32).copy(), pos, has_gauss, gauss)
    )
    torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))


class WorkerReport:
    """Which worker made a batch, and its state right after. Not a sequence, so the pin-memory
    thread passes it through untouched."""

    def __init__(self, worker: int, random_state: dict, dataset_state=None):
        self.worker = worker
        self.random_state = random_state
        self.dataset_state = dataset_state

    def as_saved(self) -> dict:
        return {"random": self.random_state, "dataset": self.dataset_state}


class Reported(tuple):
    """``(batch, report)`` as a worker returns it. A tuple, so pin_memory pins the batch and
    rebuilds the pair."""

    @property
    def batch(self):
        return self[0]

    @property
    def report(self) -> WorkerReport:
        return self[1]


class ReportingCollate:
    """A collate_fn that, in a worker, returns the batch with that worker's state after it."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn

    def __call__(self, data):
        batch = self.collate_fn(data)
        info = get_worker_info()
        if info is None:
            return batch
        dataset = info.dataset
        dataset_state = dataset.state_dict() if has_state(dataset) else None
        return Reported((batch, WorkerReport(info.id, take_random_state(), dataset_state)))


class RestoringInit:
    """A worker_init_fn: the loader's own, then the state ``states[worker_id]`` saved (None: a
    worker that had made no batch yet, which its fresh seed reproduces)."""

    def __init__(self, worker_init_fn, states: list):
        self.worker_init_fn = worker_init_fn
        self.states = states

    def __call__(self, worker_id: int) -> None:
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        state: Optional[dict] = self.states[worker_id]
        if state is None:
            return
        if state.get("dataset") is not None:
            # Before the worker's fetcher calls iter() on it, so an iterable dataset continues.
            get_worker_info().dataset.load_state_dict(state["dataset"])
        restore_random_state(state["random"])
