"""Exact resume: the random state and the position in the data, so a resumed run is the same run.

A checkpoint written mid-epoch (or at an epoch's end) holds, for every rank, the random state of
Python, NumPy and torch when the training iterator was created, how many batches it has yielded
since, the random state at the moment of the checkpoint, and the state of the data's own
workers. Resuming recreates the iterator from the first state, moves its sampler past the
yielded batches without loading them, starts each DataLoader worker in the state it had there
(``worker_state``), then restores the second state, so the data order, the augmentations and
dropout continue as if the run had never stopped, at a cost that does not grow with the position.

Where the framework cannot do that (a loader that is not a plain torch DataLoader, an iterable
dataset without ``state_dict``, a checkpoint written before worker state was kept), it replays
the pass instead: exact, but every batch before the position is loaded again, and a warning says
so.
"""

import io
import itertools
import warnings
from collections import deque

import ignite.distributed as idist
import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from gatle_ignite.data.helpers import ExactDistributedSampler
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.worker_state import (
    Reported,
    ReportingCollate,
    RestoringInit,
    has_state,
    python_random_state,
    restore_python_random_state,
)

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
        "python": python_random_state(),
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
    restore_python_random_state(state["python"])
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
    if isinstance(loader.dataset, IterableDataset):
        return None  # the dataset's own iteration is the order
    if loader.batch_sampler is not None and not isinstance(loader.batch_sampler, BatchSampler):
        return f"its batch_sampler {type(loader.batch_sampler).__name__} may keep its own state"
    # ignite's DistributedProxySampler wraps the user's sampler: both must be replayable.
    samplers = [loader.sampler, getattr(loader.sampler, "sampler", None)]
    for sampler in filter(None, samplers):
        if not isinstance(sampler, _REPLAYABLE_SAMPLERS):
            return f"its sampler {type(sampler).__name__} may keep random state of its own"
    return None


def _iterable(loader) -> bool:
    return isinstance(getattr(loader, "dataset", None), IterableDataset)


def _reporting_workers(loader) -> int:
    """How many workers report their state with each batch: every worker of a plain torch
    DataLoader whose order the resume can reproduce, else none (that loader is iterated as it
    is, and resumes by replay)."""
    if type(loader) is not DataLoader or loader.num_workers == 0:
        return 0
    return loader.num_workers if _inexact_reason(loader) is None else 0


class _SkipFirst:
    """A (batch) sampler that starts ``count`` items in: the skipped items are only indices."""

    def __init__(self, inner, count: int):
        self.inner = inner
        self.count = count

    def __iter__(self):
        # iter() now, as torch calls it, so a sampler drawing its order there draws it alike.
        return _Skipping(iter(self.inner), self.count)

    def __len__(self) -> int:
        return len(self.inner)


class _Skipping:
    """``inner`` past its first ``count`` items, skipped at the first next() (when torch would
    first ask the sampler, so one that draws its order lazily draws it at the same moment)."""

    def __init__(self, inner, count: int):
        self.inner = inner
        self.count = count

    def __iter__(self):
        return self

    def __next__(self):
        if self.count:
            count, self.count = self.count, 0
            for _ in itertools.islice(self.inner, count):
                pass
        return next(self.inner)


def _pass_loader(loader, skip: int = 0, worker_states=None) -> DataLoader:
    """``loader`` for one pass: the same dataset, order and workers, the sampler ``skip``
    batches in, each worker reporting its state with every batch and, given ``worker_states``,
    starting from them."""
    kwargs = {
        "num_workers": loader.num_workers,
        "collate_fn": ReportingCollate(loader.collate_fn),
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
    }
    # in_order came with torch 2.6; pin_memory_device is on its way out.
    for name in ("in_order", "pin_memory_device"):
        if hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    if worker_states is not None:
        kwargs["worker_init_fn"] = RestoringInit(loader.worker_init_fn, worker_states)
    if _iterable(loader):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = _SkipFirst(loader.batch_sampler, skip)
    else:
        kwargs.update(batch_size=None, sampler=_SkipFirst(loader.sampler, skip))
    return DataLoader(loader.dataset, **kwargs)


class _PassIterator:
    """The pass's batches, counted, with the worker reports taken off them."""

    def __init__(self, owner, inner):
        self._owner = owner
        self._inner = inner

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._inner)
        if isinstance(batch, Reported):
            self._owner.reports.append((self._owner.yielded, batch.report))
            batch = batch.batch
        self._owner.yielded += 1
        return batch


def _weights_only_loadable(state, dataset) -> None:
    """Refuse a dataset state the checkpoint could not be read back with."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception as error:
        raise ConfigError(
            f"{type(dataset).__name__}.state_dict() returned something a checkpoint cannot "
            f"hold ({type(error).__name__}: {str(error).splitlines()[0]}).\n"
            f"  Return tensors, numbers, strings, bytes, and lists, tuples or dicts of them."
        ) from None


class ResumableLoader:
    """Wraps the training loader to record where its iterator stands, and to resume it there.

    ``source`` returns the loader to wrap, so one that a script swaps in after ``setup()`` is
    the one trained on.
    """

    def __init__(self, source):
        self._source = source
        self.created_state = None
        self.yielded = 0
        # The workers reporting in this pass (0: none), and their latest (index, report)s.
        self.workers = 0
        self.reports = deque()
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
            return self._resume(loader, pending)
        if pending is not None:
            # Saved at the end of a pass over the data: the next pass starts from here.
            _restore(pending["now"], loader)
        return self._start(loader)

    def _start(self, loader, start: int = 0, worker_states=None):
        """Begin a pass from the current random state; with reporting workers, ``start``
        batches in, each worker starting from ``worker_states``."""
        self.created_state = _capture(loader)
        self.workers = _reporting_workers(loader)
        # Two reports per worker: enough to find each one's state before its next batch.
        self.reports = deque(maxlen=2 * self.workers)
        self.yielded = start if self.workers else 0
        if self.workers:
            loader = _pass_loader(loader, start, worker_states)
        return _PassIterator(self, iter(loader))

    def _exhausted_by(self, yielded) -> bool:
        try:
            return yielded >= len(self.loader)
        except TypeError:
            return False

    def _resume(self, loader, pending):
        position = pending["yielded"]
        _restore(pending["created"], loader)
        how = self._resume_plan(loader, pending)
        if how == "workers":
            states = pending["workers"]
            # The sampler moves to a multiple of num_workers, where worker 0's turn comes
            # again, and the fewer than num_workers batches from there are loaded again.
            start = position - position % len(states)
            iterator = self._start(loader, start, states)
            self._discard(iterator, position - start)
        elif how == "in place":
            if pending.get("dataset") is not None:
                loader.dataset.load_state_dict(pending["dataset"])
            iterator = self._start(loader)
            if not _iterable(loader):
                self._skip(iterator, position)
            self.yielded = position
        else:
            iterator = self._start(loader)
            self._discard(iterator, position)
        _restore(pending["now"], loader)
        return iterator

    def _resume_plan(self, loader, pending) -> str:
        """``"in place"`` (no workers), ``"workers"`` (their saved states) or ``"replay"``."""
        workers = getattr(loader, "num_workers", 0)
        iterable = _iterable(loader)
        stateful = not iterable or has_state(loader.dataset)
        if isinstance(loader, DataLoader) and workers == 0 and stateful:
            return "in place"
        saved = pending.get("workers")
        if _reporting_workers(loader) and saved is not None and stateful:
            if len(saved) == workers:
                return "workers"
            warnings.warn(
                f"the checkpoint was written with num_workers={len(saved)} and this run has "
                f"{workers}, so the resumed run's augmentations are not exact.",
                stacklevel=4,
            )
            pending["workers"] = [None] * workers
            return "workers"
        count = pending["yielded"]
        warnings.warn(
            f"resuming at batch {count} of the pass by loading again the {count} batches "
            f"before it, because {self._replay_reason(loader, pending, stateful)}; the resume "
            f"costs as much data loading as those iterations did.",
            stacklevel=4,
        )
        return "replay"

    @staticmethod
    def _replay_reason(loader, pending, stateful) -> str:
        if not stateful:
            return (
                f"the iterable dataset {type(loader.dataset).__name__} has no "
                f"state_dict/load_state_dict to resume it in place"
            )
        if type(loader) is not DataLoader:
            return f"the training loader is a {type(loader).__name__}, not a torch DataLoader"
        if _reporting_workers(loader) == 0:
            return _inexact_reason(loader) or "its workers cannot report their state"
        if "workers" not in pending:
            return "the checkpoint holds no DataLoader worker state (an older version wrote it)"
        return "its workers stopped taking turns in order, so their states do not line up"

    @staticmethod
    def _skip(iterator, count):
        # No workers: the batches are skipped by index, without loading them.
        inner = iterator._inner
        if not hasattr(inner, "_next_index"):
            ResumableLoader._discard(iterator, count)
            return
        for _ in range(count):
            inner._next_index()
            inner._num_yielded += 1

    @staticmethod
    def _discard(iterator, count):
        for _ in range(count):
            next(iterator)

    def position(self) -> dict:
        """Where the pass stands: what resuming needs besides the random state now."""
        state = {"created": self.created_state, "yielded": self.yielded}
        loader = self.loader
        dataset = getattr(loader, "dataset", None)
        if self.workers:
            state["workers"] = self._worker_states()
            for entry in state["workers"] or ():
                if entry is not None and entry["dataset"] is not None:
                    _weights_only_loadable(entry["dataset"], dataset)
        elif getattr(loader, "num_workers", None) == 0 and has_state(dataset):
            # In this process, the dataset stands right after the last batch yielded.
            state["dataset"] = dataset.state_dict()
            _weights_only_loadable(state["dataset"], dataset)
        return state

    def _worker_states(self):
        """Each worker's state before its next turn from the last multiple of num_workers;
        None when the workers' turns did not follow each other in order."""
        workers, position = self.workers, self.yielded
        start = position - position % workers
        reports = dict(self.reports)
        states = []
        for worker in range(workers):
            index = start + worker - workers
            if index < 0:
                states.append(None)  # no batch yet: its fresh start reproduces it
                continue
            report = reports.get(index)
            if report is None or report.worker != worker:
                return None
            states.append(report.as_saved())
        return states

    def resume_from(self, pending: dict):
        self._pending = pending


class ResumeState:
    """The checkpointed part of exact resume: every rank's random state and data position."""

    def __init__(self, loader: ResumableLoader):
        self.loader = loader

    def state_dict(self) -> dict:
        mine = {**self.loader.position(), "now": _capture(self.loader.loader)}
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
        self.loader.resume_from(dict(entry))
