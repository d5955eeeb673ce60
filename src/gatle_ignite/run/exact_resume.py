"""Exact resume: the random state and the position in the data, so a resumed run is the same run.

A checkpoint written mid-epoch (or at an epoch's end) holds, for every rank, the random state of
Python, NumPy and torch when the training iterator was created, how many batches it has yielded
since, and the random state at the moment of the checkpoint. Resuming replays the iterator's
creation from the first state, moves past the yielded batches, then restores the second state, so
the data order, the augmentations and dropout continue as if the run had never stopped.
"""

import random
import warnings

import ignite.distributed as idist
import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from gatle_ignite.data.helpers import ExactDistributedSampler

__all__ = ["ResumableLoader", "ResumeState"]

# Samplers whose order follows the global torch RNG, their own torch.Generator, or the epoch.
_REPLAYABLE_SAMPLERS = (
    SequentialSampler,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    DistributedSampler,
    ExactDistributedSampler,
)


def _generators(loader) -> list:
    """The torch.Generator objects a DataLoader draws its order from, besides the global one."""
    owners = [loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)]
    owners.append(getattr(owners[-1], "sampler", None))
    found = []
    for owner in owners:
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


def _capture(loader) -> dict:
    """This process's random state, as tensors and plain values (``weights_only`` loads it)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
        "generators": [g.get_state() for g in _generators(loader)],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore(state, loader) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["gauss"],
        )
    )
    torch.set_rng_state(state["torch"])
    for generator, saved in zip(_generators(loader), state["generators"]):
        generator.set_state(saved)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _inexact_reason(loader):
    """Why resuming this loader cannot reproduce its order, or None when it can."""
    if not isinstance(loader, DataLoader):
        return f"the training data is a {type(loader).__name__}, not a torch DataLoader"
    if loader.num_workers > 0 and loader.persistent_workers:
        return "persistent_workers=True keeps worker random state the checkpoint cannot hold"
    if loader.batch_sampler is not None and not isinstance(loader.batch_sampler, BatchSampler):
        return f"its batch_sampler {type(loader.batch_sampler).__name__} may keep its own state"
    # ignite's DistributedProxySampler wraps the user's sampler: both must be replayable.
    samplers = [loader.sampler, getattr(loader.sampler, "sampler", None)]
    for sampler in filter(None, samplers):
        if not isinstance(sampler, _REPLAYABLE_SAMPLERS):
            return f"its sampler {type(sampler).__name__} may keep random state of its own"
    return None


class _CountingIterator:
    def __init__(self, owner, inner):
        self._owner = owner
        self._inner = inner

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._inner)
        self._owner.yielded += 1
        return batch


class ResumableLoader:
    """Wraps the training loader to record where its iterator stands, and to replay it.

    ``source`` returns the loader to wrap, so one that a script swaps in after ``setup()`` is
    the one trained on.
    """

    def __init__(self, source):
        self._source = source
        self.created_state = None
        self.yielded = 0
        self._pending = None

    @property
    def loader(self):
        return self._source()

    def __getattr__(self, name):
        # Everything else (dataset, sampler, batch_size, ...) is the wrapped loader's.
        return getattr(self.__dict__["_source"](), name)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        pending, self._pending = self._pending, None
        loader = self.loader
        if pending is not None and not self._exhausted_by(pending["yielded"]):
            _restore(pending["created"], loader)
            self.created_state = _capture(loader)
            inner = iter(loader)
            self._skip(inner, pending["yielded"])
            _restore(pending["now"], loader)
            return _CountingIterator(self, inner)
        if pending is not None:
            # Saved at the end of a pass over the data: the next pass starts from here.
            _restore(pending["now"], loader)
        self.created_state = _capture(loader)
        self.yielded = 0
        return _CountingIterator(self, iter(loader))

    def _exhausted_by(self, yielded) -> bool:
        try:
            return yielded >= len(self.loader)
        except TypeError:
            return False

    def _skip(self, inner, count):
        # Without workers the batches are skipped by index, without loading them; workers must
        # load them, so each worker's own random stream advances as it did.
        by_index = getattr(self.loader, "num_workers", 1) == 0 and hasattr(inner, "_next_index")
        for _ in range(count):
            if by_index:
                inner._next_index()
                inner._num_yielded += 1
            else:
                next(inner)
        self.yielded = count

    def position(self):
        return self.created_state, self.yielded

    def resume_from(self, created, yielded, now):
        self._pending = {"created": created, "yielded": yielded, "now": now}


class ResumeState:
    """The checkpointed part of exact resume: every rank's random state and data position."""

    def __init__(self, loader: ResumableLoader):
        self.loader = loader

    def state_dict(self) -> dict:
        created, yielded = self.loader.position()
        mine = {"created": created, "yielded": yielded, "now": _capture(self.loader.loader)}
        if idist.get_world_size() > 1:
            ranks = [None] * idist.get_world_size()
            torch.distributed.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        return {"ranks": ranks}

    def load_state_dict(self, state_dict) -> None:
        ranks = state_dict["ranks"]
        world, rank = idist.get_world_size(), idist.get_rank()
        if len(ranks) != world:
            warnings.warn(
                f"the checkpoint was written by {len(ranks)} rank(s) and this run has {world}, so "
                f"the resumed run's data order and random state are not exact.",
                stacklevel=2,
            )
        entry = ranks[rank % len(ranks)]
        reason = _inexact_reason(self.loader.loader)
        if reason is not None:
            warnings.warn(
                f"resuming, but {reason}, so the resumed run may not see the data in the same "
                f"order: it is not exactly the run that was interrupted.",
                stacklevel=2,
            )
        self.loader.resume_from(entry["created"], entry["yielded"], entry["now"])
