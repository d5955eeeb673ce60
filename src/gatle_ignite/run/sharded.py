"""Sharded checkpoints: a ``.dcp`` directory written by torch.distributed.checkpoint (DCP).

Every rank writes its own shard into a staging directory; DCP's coordinator writes the
``.metadata`` file only once every rank's write is done, and rank 0 then renames the directory
into place, so a reader sees a whole checkpoint or none. Loading goes through DCP too, which
reshards the tensors to whatever layout the loading side has (another world size, or one plain
process).

DCP reads its ``.metadata`` with ``pickle`` and its non-tensor values with
``torch.load(weights_only=False)``; here the first is read by an unpickler that admits only the
exact globals DCP's metadata holds, and the second with ``weights_only=True``, so a ``.dcp``
directory can no more run code on load than a ``.pt`` file can.
"""

import os
import pickle
import shutil
import warnings
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from gatle_ignite.run.host_memory import host_copy
from gatle_ignite.run.layout import staging_path
from gatle_ignite.run.storage import is_url, place_of, sharded_io

__all__ = ["ShardedCheckpoint", "finish_sharded", "save_sharded", "staging_for"]

# DCP warns whenever it runs without a process group; one process is what is meant then. A
# filter, not a catch_warnings block, which would reset the once-per-place memory of every
# other warning.
warnings.filterwarnings(
    "ignore", message="torch.distributed is disabled", module="torch.distributed.checkpoint"
)


def _by_name(*objects) -> dict:
    return {(obj.__module__, obj.__qualname__): obj for obj in objects}


# Every global a DCP .metadata file names, as (module, name) exactly: what torch 2.13's DCP writes
# for models, optimizers, non-tensor values and FSDP2 shards, flattened or not (listed from real
# checkpoints with pickletools). Each maps to its object here, so no name is ever looked up, and
# a dotted one (protocol 4's "os.system" within a DCP module) resolves to nothing. Anything else
# is refused, as a .pt holding pickled objects is.
_METADATA_GLOBALS = {
    **_by_name(
        dcp_metadata.Metadata,
        dcp_metadata.MetadataIndex,
        dcp_metadata.StorageMeta,
        dcp_metadata.BytesStorageMetadata,
        dcp_metadata.TensorStorageMetadata,
        dcp_metadata.ChunkStorageMetadata,
        dcp_metadata.TensorProperties,
        dcp_metadata._MEM_FORMAT_ENCODING,
        filesystem._StorageInfo,
    ),
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    **{
        ("torch", name): value
        for name, value in vars(torch).items()
        if isinstance(value, torch.dtype)
    },
    # The checkpoint_id the save was given (pathlib's module is "pathlib._local" from Python
    # 3.13 on), kept as its text only: a pure path of either flavour is built on any system.
    **{
        (module, f"{flavour}Path"): path
        for module in ("pathlib", "pathlib._local")
        for flavour, path in (("Posix", PurePosixPath), ("Windows", PureWindowsPath))
    },
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _METADATA_GLOBALS[(module, name)]
        except (KeyError, TypeError):
            raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}") from None


class _SafeMetadata:
    """DCP's reader, its ``.metadata`` read by the unpickler above."""

    def read_metadata(self, *args, **kwargs):
        path = self.fs.concat_path(self.path, ".metadata")
        with self.fs.create_stream(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
        if hasattr(metadata, "storage_meta") and metadata.storage_meta is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafeReader(_SafeMetadata, FileSystemReader):
    pass


def _reader(path):
    """The safe reader of a local directory, or of a URL through DCP's fsspec reader."""
    if not is_url(path):
        return _SafeReader(path)
    return type("_SafeFsspecReader", (_SafeMetadata, sharded_io().reader), {})(path)


class _SafePlanner(DefaultLoadPlanner):
    """DCP's planner, reading non-tensor values as ``weights_only`` loads."""

    def load_bytes(self, read_item, value) -> None:
        loaded = torch.load(value, weights_only=True)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            _set_path(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def _set_path(root, path, value) -> None:
    node = root
    for key, following in zip(path[:-1], path[1:]):
        if isinstance(node, list):
            while len(node) <= key:
                node.append(None)
        if node[key] if isinstance(node, list) else key in node:
            node = node[key]
            continue
        node[key] = [] if isinstance(following, int) else {}
        node = node[key]
    if isinstance(node, list):
        while len(node) <= path[-1]:
            node.append(None)
    node[path[-1]] = value


def _skeleton(metadata) -> dict:
    """A state dict shaped like the checkpoint: empty full tensors, None for other values."""
    root = {}
    for fqn, item in metadata.state_dict_metadata.items():
        path = metadata.planner_data.get(fqn, (fqn,)) if metadata.planner_data else (fqn,)
        if isinstance(item, TensorStorageMetadata):
            value = torch.empty(item.size, dtype=item.properties.dtype)
        else:
            value = None
        _set_path(root, path, value)
    return root


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
        # A URL stays text: a Path would collapse its '//'.
        self.path = path if is_url(path) else Path(path)
        self._reader = _reader(self.path)
        self.metadata = self._reader.read_metadata()
        self._top = {
            (self.metadata.planner_data or {}).get(fqn, (fqn,))[0]
            for fqn in self.metadata.state_dict_metadata
        }
        missing = self._missing_shards()
        if missing:
            raise FileNotFoundError(f"shard file(s) {missing} are missing")

    def _missing_shards(self) -> list:
        names = {info.relative_path for info in (self.metadata.storage_data or {}).values()}
        fs = self._reader.fs
        return sorted(n for n in names if not fs.exists(fs.concat_path(self.path, n)))

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
        skeleton = _skeleton(self.metadata)
        template = {key: _merged(skeleton[key], obj.state_dict()) for key, obj in objects.items()}
        self._load(template)
        for key, obj in objects.items():
            obj.load_state_dict(template[key])

    def full(self, only=None) -> dict:
        """Every entry (or the top-level ``only``) as full tensors, in this process alone."""
        skeleton = _skeleton(self.metadata)
        if only is not None:
            skeleton = {only: skeleton[only]}
        self._load(skeleton, no_dist=True)
        return skeleton

    def _load(self, template: dict, no_dist: bool = False) -> None:
        dcp.load(
            template,
            checkpoint_id=self.path,
            storage_reader=_reader(self.path),
            planner=_SafePlanner(),
            no_dist=no_dist or not _distributed(),
        )
