"""Sharded checkpoints: a ``.dcp`` directory written by torch.distributed.checkpoint (DCP).

Every rank writes its own shard into a staging directory; DCP's coordinator writes the
``.metadata`` file only once every rank's write is done, and rank 0 then renames the directory
into place, so a reader sees a whole checkpoint or none. Loading goes through DCP too, which
reshards the tensors to whatever layout the loading side has (another world size, or one plain
process).

DCP reads its ``.metadata`` with ``pickle`` and its non-tensor values with
``torch.load(weights_only=False)``; here the first is read by ``run.sharded_metadata``, whose
unpickler admits only the exact globals DCP's metadata holds and which holds what it read
against the files present, and the second with ``weights_only=True``. So a ``.dcp`` directory
can no more run code on load than a ``.pt`` file can, nor have a load read outside it or
allocate more than its files hold.
"""

import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from gatle_ignite.run.host_memory import host_copy
from gatle_ignite.run.layout import staging_path
from gatle_ignite.run.sharded_metadata import entry_path, read_metadata, set_path, skeleton
from gatle_ignite.run.storage import is_url, place_of, sharded_io

__all__ = ["ShardedCheckpoint", "finish_sharded", "save_sharded", "staging_for"]

# DCP warns whenever it runs without a process group; one process is what is meant then. A
# filter, not a catch_warnings block, which would reset the once-per-place memory of every
# other warning.
warnings.filterwarnings(
    "ignore", message="torch.distributed is disabled", module="torch.distributed.checkpoint"
)


class _SafeMetadata:
    """DCP's reader, its ``.metadata`` read by ``run.sharded_metadata``."""

    def read_metadata(self, *args, **kwargs):
        metadata = read_metadata(_directory(self.path))
        if metadata.storage_meta is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafeReader(_SafeMetadata, FileSystemReader):
    pass


def _directory(path):
    """A local directory as a Path; a URL stays text (a Path would collapse its '//')."""
    return str(path) if is_url(str(path)) else Path(path)


def _reader(path):
    """The safe reader of a local directory, or of a URL through DCP's fsspec reader."""
    if not is_url(str(path)):
        return _SafeReader(path)
    return type("_SafeFsspecReader", (_SafeMetadata, sharded_io().reader), {})(str(path))


class _SafePlanner(DefaultLoadPlanner):
    """DCP's planner, reading non-tensor values as ``weights_only`` loads."""

    def load_bytes(self, read_item, value) -> None:
        loaded = torch.load(value, weights_only=True)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            set_path(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def _merged(saved, live):
    """``saved`` (a skeleton of the checkpoint), with the live object's tensors where both have
    a tensor of the same global shape, so those load in place."""
    if isinstance(saved, dict):
        live = live if isinstance(live, dict) else {}
        return {key: _merged(value, live.get(key)) for key, value in saved.items()}
    if isinstance(saved, list):
        live = live if isinstance(live, (list, tuple)) and len(live) == len(saved) else []
        return [_merged(value, live[i] if live else None) for i, value in enumerate(saved)]
    if isinstance(saved, torch.Tensor) and isinstance(live, torch.Tensor):
        return live if live.shape == saved.shape else saved
    return saved


class _HostStager:
    """DCP's staging step for the run's background writes: the state copied to host memory,
    into the buffers of the previous copy when they fit (see ``host_copy``)."""

    # DCP asks it, then calls synchronize_staging, which has nothing to wait for.
    should_synchronize_after_execute = True

    def __init__(self, writes):
        self.writes = writes

    def stage(self, state_dict):
        self.writes.host_buffers = host_copy(state_dict, self.writes.host_buffers)
        return self.writes.host_buffers

    def synchronize_staging(self) -> None:
        """The copy is done when ``stage`` returns."""

    def close(self) -> None:
        """Nothing to release: the buffers are the run's."""


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def staging_for(path):
    """The one staging name every rank agrees on for ``path`` (a directory, or a URL)."""
    if is_url(path):
        folder, name = path.rsplit("/", 1)
        return f"{folder}/{staging_path(Path(name), 'dcp').name}"
    return staging_path(path, "dcp")


def save_sharded(state: dict, path: Path, process_group=None, writes=None):
    """Write ``state`` as the DCP directory ``path``, through its staging directory.

    Every rank calls it. Returns ``None`` once written, or, given the run's background
    ``writes``, DCP's future once the state is staged in host memory; call
    :func:`finish_sharded` after either.
    """
    staging = staging_for(path)
    distributed = _distributed()
    if not distributed or dist.get_rank() == 0:
        _remove_tree(staging)
    if distributed:
        dist.barrier()
    options = {"checkpoint_id": staging, "process_group": process_group, "no_dist": not distributed}
    if is_url(staging):
        # Every rank writes its shard to the store itself; the coordinator the metadata last.
        options["storage_writer"] = sharded_io().writer(staging)
    if writes is None:
        dcp.save(state, **options)
        return None
    return dcp.async_save(state, async_stager=_HostStager(writes), **options)


def _remove_tree(path) -> None:
    if is_url(path):
        folder, name = path.rsplit("/", 1)
        place_of(folder).remove(name)
    else:
        shutil.rmtree(path, ignore_errors=True)


def finish_sharded(path) -> None:
    """On rank 0, once DCP wrote the metadata: move the staging directory into place."""
    staging = staging_for(path)
    if is_url(path):
        folder, name = path.rsplit("/", 1)
        place_of(folder).move_directory(staging.rsplit("/", 1)[1], name)
        return
    if path.exists():
        # A name written again (a resumed epoch): the old directory steps aside first.
        old = staging_path(path, "replaced")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(staging, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, path)


class ShardedCheckpoint:
    """A ``.dcp`` directory, read lazily: validated now, loaded into objects on ``restore``."""

    def __init__(self, path):
        self.path = _directory(path)
        self.metadata = _reader(self.path).read_metadata()
        self._top = {entry_path(self.metadata, fqn)[0] for fqn in self.metadata.state_dict_metadata}

    def __contains__(self, key) -> bool:
        return key in self._top

    def keys(self):
        return set(self._top)

    def get(self, key, default=None):
        """One top-level entry, loaded in full (small values: an engine's state)."""
        if key not in self._top:
            return default
        return self.full(only=key)[key]

    def restore(self, objects: dict) -> None:
        """Load the entries into ``objects`` (key -> object with state_dict/load_state_dict),
        resharded to however those objects are laid out now.

        The checkpoint's own layout is the template, so an entry whose shape varies (a random
        state captured or not yet) loads as saved; a tensor the live object holds at the same
        place (a shard of a parameter) is loaded in place instead, resharded.
        """
        saved = skeleton(self.metadata)
        template = {key: _merged(saved[key], obj.state_dict()) for key, obj in objects.items()}
        self._load(template)
        for key, obj in objects.items():
            obj.load_state_dict(template[key])

    def full(self, only=None) -> dict:
        """Every entry (or the top-level ``only``) as full tensors, in this process alone."""
        entries = skeleton(self.metadata)
        if only is not None:
            entries = {only: entries[only]}
        self._load(entries, no_dist=True)
        return entries

    def _load(self, template: dict, no_dist: bool = False) -> None:
        dcp.load(
            template,
            checkpoint_id=self.path,
            storage_reader=_reader(self.path),
            planner=_SafePlanner(),
            no_dist=no_dist or not _distributed(),
        )
