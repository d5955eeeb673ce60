"""A sharded checkpoint's ``.metadata``, read safely: only DCP's own classes unpickled, then
held against the files present before anything is loaded.

DCP trusts its metadata: it reads each shard at the path the metadata names, allocates each
tensor at the size it claims, and places each value at the list position it gives. A ``.dcp``
copied from someone else may claim anything, so here every shard it names must be a plain file
of the directory (``../other.dcp/...`` or an absolute path is refused: it would read another
checkpoint), every range it reads must lie within its file without overlapping another, every
tensor's chunks must lie within it, cover it and be held by those ranges, and the list
positions are bounded by the metadata's own size. What a load reads and allocates is then
bounded by the directory's own bytes, whatever the metadata claims.
"""

import io
import math
import os
import pickle
import sys
from contextlib import contextmanager
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch
from torch.distributed.checkpoint import filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from gatle_ignite.run.filesystem import UnsafeFile, leads_out, open_regular

__all__ = [
    "METADATA_FILE",
    "DamagedMetadata",
    "UnsafeMetadata",
    "entry_path",
    "metadata_bytes",
    "read_metadata",
    "set_path",
    "skeleton",
]

METADATA_FILE = ".metadata"
# The most of a .metadata read: one entry per tensor chunk and value, a few hundred bytes each,
# so this holds about a million; and the bound on what a planted one costs.
METADATA_LIMIT = 256 << 20
# Deeper than any state dict nests; the skeleton of a deeper one would recurse without end.
_MOST_DEPTH = 64


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


# Python's own unpickler, not the C one: that one sizes its memo from the index a file names up
# front, so a 13-byte pickle naming memo slot 2**30 asks for 16 GiB; this one keeps a dict.
class _MetadataUnpickler(pickle._Unpickler):
    def find_class(self, module, name):
        try:
            return _METADATA_GLOBALS[(module, name)]
        except (KeyError, TypeError):
            raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}") from None


class UnsafeMetadata(ValueError):
    """A ``.metadata`` that would have a load read outside its ``.dcp`` directory."""


class DamagedMetadata(ValueError):
    """A ``.metadata`` that the files present cannot back: its sizes, ranges or indices."""


def read_metadata(directory: Path):
    """The metadata of the ``.dcp`` ``directory``, unpickled by the restricted reader and held
    against the files present (``_check``).

    Raises ``pickle.UnpicklingError`` for a global DCP's metadata does not hold,
    ``UnsafeMetadata`` for a read outside ``directory``, ``FileNotFoundError`` for a missing
    file and ``DamagedMetadata`` for anything else the files cannot back.
    """
    data = metadata_bytes(directory)
    metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    _check(metadata, directory, len(data))
    return metadata


def metadata_bytes(directory) -> bytes:
    """The ``.dcp`` ``directory``'s metadata file, read as a run directory's files are (at a
    URL: refused past the same size)."""
    if isinstance(directory, str):
        size = _remote_size(directory, METADATA_FILE)
        if size > METADATA_LIMIT:
            raise DamagedMetadata(f"{METADATA_FILE} is {size} bytes, more than a metadata holds")
        return _remote(directory).read_bytes(METADATA_FILE) or b""
    with _opened(directory / METADATA_FILE, METADATA_LIMIT) as handle:
        return handle.read(METADATA_LIMIT)


def _remote(directory: str):
    from gatle_ignite.run.storage import place_of

    return place_of(directory)


def _remote_size(directory: str, name: str) -> int:
    size = _remote(directory).size(name)
    if size is None:
        raise FileNotFoundError(f"{directory}/{name}")
    return size


def set_path(root, path, value) -> None:
    """Put ``value`` at ``path`` (keys and list positions) in ``root``, making the dicts and
    lists (padded with None) on the way."""
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


def entry_path(metadata, fqn: str) -> tuple:
    """Where the entry ``fqn`` sits in the state dict: its keys and list positions."""
    return tuple(metadata.planner_data.get(fqn, (fqn,)) if metadata.planner_data else (fqn,))


def skeleton(metadata, tensors: bool = True) -> dict:
    """A state dict shaped like the checkpoint: empty full tensors (or None, without
    ``tensors``), None for other values."""
    root = {}
    for fqn, item in metadata.state_dict_metadata.items():
        value = None
        if tensors and isinstance(item, TensorStorageMetadata):
            value = torch.empty(item.size, dtype=item.properties.dtype)
        set_path(root, entry_path(metadata, fqn), value)
    return root


# ---- the metadata held against the files present ----


def _check(metadata, directory: Path, metadata_bytes: int) -> None:
    """Raise ``UnsafeMetadata`` for a shard outside ``directory``, ``FileNotFoundError`` for a
    missing one, and ``DamagedMetadata`` for anything the files present cannot back.

    What a load then reads lies within the shard files, each range once, and every tensor's
    bytes are held by its chunks' ranges; the lists the skeleton pads out are bounded by the
    metadata's own size. So neither time nor memory exceeds what the directory holds.
    """
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise DamagedMetadata(f"it holds a {type(metadata).__name__}, not DCP's metadata")
    items, storage = metadata.state_dict_metadata, metadata.storage_data
    if not isinstance(items, dict) or not isinstance(storage, dict):
        raise DamagedMetadata("its index of entries or of storage is not a mapping")
    if not isinstance(metadata.storage_meta, (dcp_metadata.StorageMeta, type(None))):
        raise DamagedMetadata("its storage_meta is not DCP's")
    _check_ranges(storage, _shard_sizes(storage, directory))
    for fqn, item in items.items():
        if not isinstance(fqn, str):
            raise DamagedMetadata(f"an entry is named {fqn!r}, not a text")
        if isinstance(item, TensorStorageMetadata):
            _check_tensor(fqn, item, storage)
        elif not isinstance(item, dcp_metadata.BytesStorageMetadata):
            raise DamagedMetadata(f"entry {fqn!r} is a {type(item).__name__}")
        elif not isinstance(storage.get(dcp_metadata.MetadataIndex(fqn)), filesystem._StorageInfo):
            raise DamagedMetadata(f"entry {fqn!r} has no storage")
    _check_paths(metadata, metadata_bytes)


def _shard_sizes(storage: dict, directory: Path) -> dict:
    """``{shard file name: size}`` of the files the storage entries name."""
    names = set()
    for index, info in storage.items():
        if not isinstance(index, dcp_metadata.MetadataIndex):
            raise DamagedMetadata(f"a storage key is a {type(index).__name__}")
        if not isinstance(info, filesystem._StorageInfo):
            raise DamagedMetadata(f"the storage of {index.fqn!r} is a {type(info).__name__}")
        if info.transform_descriptors:
            # A compressed shard could expand without bound; the framework writes none.
            raise DamagedMetadata(
                f"the storage of {index.fqn!r} is transformed ({info.transform_descriptors!r}), "
                f"which gatle-ignite never writes"
            )
        names.add(_plain_name(info.relative_path, directory))
    if isinstance(directory, str):
        # At a URL: the objects' sizes as the store lists them.
        sizes = {name: _remote(directory).size(name) for name in names}
        missing = sorted(name for name, size in sizes.items() if size is None)
    else:
        missing = sorted(name for name in names if not (directory / name).exists())
    if missing:
        raise FileNotFoundError(f"shard file(s) {missing} are missing")
    if isinstance(directory, str):
        return sizes
    return {name: _shard_size(directory / name) for name in names}


def _plain_name(name, directory: Path) -> str:
    """``name``, when it names a file directly in ``directory`` (as DCP's are)."""
    plain = (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(mark in name for mark in ("/", "\\", "\0"))
    )
    if not plain:
        raise UnsafeMetadata(
            f"it names the shard {name!r}, which is no file of {directory} (DCP writes plain names)"
        )
    return name


@contextmanager
def _opened(path: Path, limit: int):
    """A file of the ``.dcp`` directory, opened as a run directory's files are: a link out is a
    read outside, anything else that is no regular file of at most ``limit`` bytes damage."""
    target = leads_out(path)
    if target is not None:
        raise UnsafeMetadata(f"{path.name} is a symbolic link to {target}, outside {path.parent}")
    try:
        handle = open_regular(path, limit)
    except UnsafeFile as error:
        raise DamagedMetadata(f"{path.name} cannot be read: {error}") from None
    with handle:
        yield handle


def _shard_size(path: Path) -> int:
    with _opened(path, sys.maxsize) as handle:
        return os.fstat(handle.fileno()).st_size


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DamagedMetadata(f"{what} is {value!r}, not a whole number >= 0")
    return value


def _check_ranges(storage: dict, sizes: dict) -> None:
    """Every range lies within its file, and no two overlap (DCP writes each item once)."""
    ranges = {name: [] for name in sizes}
    for index, info in storage.items():
        start = _count(info.offset, f"the offset of {index.fqn!r}")
        end = start + _count(info.length, f"the length of {index.fqn!r}")
        size = sizes[info.relative_path]
        if end > size:
            raise DamagedMetadata(
                f"{index.fqn!r} is read from bytes {start}-{end} of {info.relative_path}, "
                f"which holds {size} (truncated, or not this checkpoint's shard)"
            )
        ranges[info.relative_path].append((start, end, index.fqn))
    for name, spans in ranges.items():
        spans.sort()
        for (_start, end, first), (start, _end, second) in zip(spans, spans[1:]):
            if start < end:
                raise DamagedMetadata(f"{first!r} and {second!r} overlap in {name}")


def _dims(value, what: str) -> tuple:
    dims = tuple(_count(dim, what) for dim in value) if isinstance(value, (tuple, list)) else None
    if dims is None or any(dim >= 1 << 63 for dim in dims):
        raise DamagedMetadata(f"{what} is {value!r}, not a shape")
    return dims


def _check_tensor(fqn: str, item: TensorStorageMetadata, storage: dict) -> None:
    """The tensor's chunks lie within it, cover it, and each is held by its own range."""
    properties = item.properties
    if not isinstance(properties, dcp_metadata.TensorProperties) or not isinstance(
        properties.dtype, torch.dtype
    ):
        raise DamagedMetadata(f"tensor {fqn!r} has no dtype")
    size = _dims(item.size, f"the size of {fqn!r}")
    if not isinstance(item.chunks, list):
        raise DamagedMetadata(f"tensor {fqn!r} has no list of chunks")
    held, places = 0, set()
    for chunk in item.chunks:
        offsets = _dims(getattr(chunk, "offsets", None), f"a chunk offset of {fqn!r}")
        sizes = _dims(getattr(chunk, "sizes", None), f"a chunk size of {fqn!r}")
        inside = len(offsets) == len(sizes) == len(size) and all(
            start + length <= dim for start, length, dim in zip(offsets, sizes, size)
        )
        if not inside or offsets in places:
            raise DamagedMetadata(
                f"tensor {fqn!r} of size {list(size)} has a chunk at "
                f"{list(offsets)} of size {list(sizes)}"
            )
        places.add(offsets)
        info = storage.get(dcp_metadata.MetadataIndex(fqn, offsets))
        needed = math.prod(sizes) * properties.dtype.itemsize
        if not isinstance(info, filesystem._StorageInfo) or info.length < needed:
            raise DamagedMetadata(
                f"a chunk of tensor {fqn!r} needs {needed} bytes, and its storage holds "
                f"{getattr(info, 'length', 0)}"
            )
        held += math.prod(sizes)
    if held < math.prod(size):
        raise DamagedMetadata(
            f"tensor {fqn!r} has {math.prod(size)} elements, and its chunks hold {held}"
        )


def _check_paths(metadata, metadata_bytes: int) -> None:
    """Each entry's place in the state dict spells its name, as DCP's flattening does, and the
    list positions in them pad no more than the metadata's size in list slots."""
    if not isinstance(metadata.planner_data, (dict, type(None))):
        raise DamagedMetadata("its planner data is not a mapping")
    slots = {}
    for fqn in metadata.state_dict_metadata:
        path = (metadata.planner_data or {}).get(fqn, (fqn,))
        keys_only = isinstance(path, (tuple, list)) and all(
            isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool))
            for key in path
        )
        if not (keys_only and 0 < len(path) <= _MOST_DEPTH and isinstance(path[0], str)):
            raise DamagedMetadata(f"entry {fqn!r} sits at {path!r}")
        path = tuple(path)
        if ".".join(map(str, path)) != fqn:
            raise DamagedMetadata(f"entry {fqn!r} sits at {path!r}, which is another name")
        for depth, key in enumerate(path):
            if isinstance(key, int):
                _count(key, f"a list position of {fqn!r}")
                slots[path[:depth]] = max(slots.get(path[:depth], 0), key + 1)
    if sum(slots.values()) > metadata_bytes:
        raise DamagedMetadata(
            f"its entries sit at list positions up to {max(slots.values())}, more than its "
            f"{metadata_bytes} bytes can describe"
        )
    try:
        skeleton(metadata, tensors=False)
    except (TypeError, KeyError, IndexError, AttributeError) as error:
        raise DamagedMetadata(f"its entries' places conflict ({error})") from None
