"""Recognising a checkpoint whose state is already on disk, so it is linked, not written again.

In an epoch whose score improves, the best file and the latest file are written a few handlers
apart, usually from the very same state. A snapshot records what identifies that state cheaply:
tensors by the memory they view and their version counter (which every in-place change
bumps), plain values as they are. A small tensor built afresh for each checkpoint (an RNG state)
is compared by value. Two snapshots that compare equal describe the same checkpoint.
"""

import os
import uuid
from pathlib import Path
from typing import Optional

import torch

from gatle_ignite.run.layout import staging_path

__all__ = ["LastWrite", "snapshot"]

# A tensor built afresh for the checkpoint is compared by value up to this size.
_COMPARED_BYTES = 64 * 1024
_PLAIN = (int, float, str, bytes, bool, type(None), torch.dtype, torch.device)
_SCALARS = {int, float, str}


class _Unsupported(Exception):
    """A value the snapshot cannot vouch for; such a checkpoint is always written."""


def _walk(value, leaves: list, tensors: list) -> None:
    if torch.is_tensor(value):
        if value.layout != torch.strided:
            raise _Unsupported(value.layout)
        leaves.append(("tensor", value.dtype, value.device, tuple(value.shape)))
        tensors.append(_TensorRecord(value))
    elif isinstance(value, dict):
        leaves.append(("dict", len(value)))
        for key, item in value.items():
            if not isinstance(key, _PLAIN):
                raise _Unsupported(key)
            leaves.append(("key", type(key), key))
            _walk(item, leaves, tensors)
    elif isinstance(value, (list, tuple)):
        kinds = set(map(type, value))
        if len(kinds) == 1 and kinds <= _SCALARS:
            # A run of numbers of one type (a Python RNG state: 625 ints) is one leaf, not
            # hundreds; one type, so that 1 and True, or 1 and 1.0, never pass for each other.
            leaves.append((type(value), *kinds, tuple(value)))
            return
        leaves.append((type(value), len(value)))
        for item in value:
            _walk(item, leaves, tensors)
    elif isinstance(value, _PLAIN):
        leaves.append(("value", type(value), value))
    else:
        raise _Unsupported(value)


class _TensorRecord:
    """A tensor as it was: where its values live, and its version counter then."""

    def __init__(self, tensor):
        try:
            self.version = tensor._version
            # The first element's address and the layout from it name the memory it views.
            self.where = (tensor.data_ptr(), tensor.stride())
        except RuntimeError as error:
            # An inference tensor keeps no version counter; a wrapper (a DTensor) has no storage.
            raise _Unsupported(tensor) from error
        # Held, so that no later tensor can take over the same memory and look unchanged.
        self.tensor = tensor

    def holds_the_same_as(self, later: "_TensorRecord") -> bool:
        if self.where == later.where:
            return self.version == later.version
        # Another tensor (an RNG state, built afresh by each state_dict()): small ones are
        # compared by value, provided this one was not written to since.
        small = self.tensor.numel() * self.tensor.element_size() <= _COMPARED_BYTES
        unchanged = self.tensor._version == self.version
        return small and unchanged and torch.equal(self.tensor, later.tensor)


class _Snapshot:
    def __init__(self, leaves: list, tensors: list):
        self.leaves = leaves
        self.tensors = tensors

    def __eq__(self, other) -> bool:
        if not isinstance(other, _Snapshot) or self.leaves != other.leaves:
            return False
        return all(a.holds_the_same_as(b) for a, b in zip(self.tensors, other.tensors))

    __hash__ = None


def snapshot(checkpoint) -> Optional[_Snapshot]:
    """What identifies ``checkpoint``'s contents, or None when it holds a value of another kind."""
    leaves, tensors = [], []
    try:
        _walk(checkpoint, leaves, tensors)
    except _Unsupported:
        return None
    return _Snapshot(leaves, tensors)


class LastWrite:
    """The last checkpoint file a run wrote and the snapshot of the state it holds."""

    def __init__(self):
        self._path = None
        self._snapshot = None

    @property
    def path(self) -> Optional[Path]:
        """The last file written."""
        return self._path

    def remember(self, path: Path, state: Optional[_Snapshot]) -> None:
        self._path, self._snapshot = path, state

    def link_if_same(self, state: Optional[_Snapshot], path: Path) -> bool:
        """Make ``path`` a hard link to the last file when it holds ``state``; False otherwise.

        The link replaces ``path`` atomically, as a written file would, and a file system
        without hard links (or a last file since removed) just means writing it instead.
        """
        last = self._path
        if state is None or last is None or last == path or state != self._snapshot:
            return False
        # A fresh name: os.link refuses to overwrite, so no other file can be clobbered.
        staging = staging_path(path, uuid.uuid4().hex[:8])
        try:
            os.link(last, staging)
        except OSError:
            return False
        os.replace(staging, path)
        return True
