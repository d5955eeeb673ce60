"""Reading checkpoints back: safe loads, telling a damaged file from a dangerous one, weights.

Every load is ``torch.load(weights_only=True)``, so a checkpoint can never run code. A file
that fails to load is either damaged (empty, truncated, random bytes, not a checkpoint at all):
callers skip it with a warning and try the next; or it is complete and really holds pickled
objects, which is refused outright, because loading it anyway would run what it names.
"""

import io
import pickle
import pickletools
import re
import zipfile
from pathlib import Path
from typing import NamedTuple, Optional

import torch
from ignite.handlers import Checkpoint

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.utils.dist import rank_zero_print

__all__ = [
    "Origin",
    "RUN_IDENTITY_KEY",
    "RunIdentity",
    "RunMeta",
    "UnreadableCheckpoint",
    "VanishedCheckpoint",
    "load_checkpoint_file",
    "load_weights",
    "read_origin",
    "report_weight_match",
    "restore",
]

SAFETENSORS_SUFFIX = ".safetensors"
# The pickles of torch's pre-1.6 format before its raw tensor bytes: magic number, protocol
# version, system info, then the object itself.
_LEGACY_PICKLES = 4


class UnreadableCheckpoint(Exception):
    """A checkpoint file that cannot be loaded because it is damaged or not a checkpoint."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class VanishedCheckpoint(UnreadableCheckpoint):
    """A checkpoint that is no longer there: removed (rotated out by a run training in its
    directory) between being listed and being read."""

    def __init__(self, path):
        super().__init__(path, "it is gone: removed since it was listed")


class RunMeta:
    """Records in each checkpoint the max_epochs the run's LR schedule was built for, so a
    resume with another max_epochs can say the schedule keeps its length."""

    def __init__(self, max_epochs):
        self.max_epochs = max_epochs
        self.restored_max_epochs = None

    def state_dict(self) -> dict:
        return {"max_epochs": self.max_epochs}

    def load_state_dict(self, state_dict) -> None:
        self.restored_max_epochs = state_dict.get("max_epochs")


# The checkpoint key of RunIdentity.
RUN_IDENTITY_KEY = "run_identity"


class RunIdentity:
    """Records in each checkpoint the id of the run that wrote it, by which a file its run did
    not index is told to be the run's own (written, then cut off by a kill before it was
    indexed) or not (copied or planted there). Written, never restored."""

    def __init__(self, run_id: str):
        self.run_id = run_id

    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, state_dict) -> None:
        """Nothing to restore: the id is only read back by ``read_origin``."""


def _pickle_parses(stream, count: int) -> bool:
    """Whether ``count`` complete pickles follow one another in ``stream``."""
    try:
        for _ in range(count):
            for _op in pickletools.genops(stream):
                pass
    except Exception:  # any malformation: truncated, an unknown opcode, bad arguments
        return False
    return True


def _is_complete_pickle_of_objects(path) -> bool:
    """Whether the file is whole, so that a refused global really is one it names.

    A truncated pickle can end in the middle of a global's name and look like a request for a
    function that does not exist; a whole one that names a global means code.
    """
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("data.pkl")]
            if not names:
                return False
            with archive.open(names[0]) as stream:
                return _pickle_parses(stream, 1)
    with open(path, "rb") as stream:
        return _pickle_parses(stream, _LEGACY_PICKLES)


def _refusal(path, error) -> ConfigError:
    named = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = f" (it names {named.group(1)})" if named else ""
    return ConfigError(
        f"refusing to load {path}: it holds objects other than tensors and plain Python "
        f"values, which could run code when unpickled{what}.\n"
        f"  Nothing was executed. Only load checkpoints you trust, re-saved as plain state "
        f"dicts."
    )


def load_checkpoint_file(path, map_location="cpu", mmap: bool = False):
    """``torch.load`` with ``weights_only=True``; raises UnreadableCheckpoint for a damaged
    file and ConfigError for one that holds pickled code.

    A sharded ``.dcp`` directory is checked (its metadata read, its shards present) and
    returned as a :class:`~gatle_ignite.run.sharded.ShardedCheckpoint`, loaded on ``restore``.
    """
    if isinstance(path, str) and "://" in path:
        # A sharded checkpoint at a URL, read in place by every rank.
        return _open_sharded(path)
    path = Path(path)
    if path.is_dir():
        return _open_sharded(path)
    try:
        if path.stat().st_size == 0:
            raise UnreadableCheckpoint(path, "the file is empty")
        mmap = mmap and zipfile.is_zipfile(path)
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except UnreadableCheckpoint:
        raise
    except FileNotFoundError as error:
        raise VanishedCheckpoint(path) from error
    except pickle.UnpicklingError as error:
        if "GLOBAL" in str(error) and _is_complete_pickle_of_objects(path):
            raise _refusal(path, error) from error
        raise _unreadable(path, error) from error
    except (OSError, RuntimeError, EOFError, ValueError, KeyError, IndexError, TypeError) as error:
        raise _unreadable(path, error) from error


def _unreadable(path: Path, error: Exception) -> UnreadableCheckpoint:
    try:
        return UnreadableCheckpoint(path, _diagnosis(path, error))
    except FileNotFoundError:
        return VanishedCheckpoint(path)


def _diagnosis(path: Path, error: Exception) -> str:
    """What is wrong with a file torch could not load, told from what the file is: torch's own
    error for it is about its internals (a zip directory, a pickle opcode)."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if zipfile.is_zipfile(path):
        if isinstance(error, pickle.UnpicklingError):
            return "a torch archive whose pickled state is damaged"
        first = (str(error).splitlines() or [type(error).__name__])[0]
        return f"a torch archive with damaged contents ({first[:120]})"
    if head.startswith(b"PK\x03\x04"):
        return "truncated: a torch archive whose end is missing (an interrupted write or copy)"
    if head.startswith(b"\x80"):
        return "a damaged or truncated checkpoint in torch's legacy (pickle) format"
    return "not a torch checkpoint: neither a zip archive nor a pickle"


def _open_sharded(path: Path):
    from gatle_ignite.run.sharded import ShardedCheckpoint
    from gatle_ignite.run.sharded_metadata import (
        METADATA_FILE,
        DamagedMetadata,
        UnsafeMetadata,
        metadata_bytes,
    )

    metadata = f"{path}/{METADATA_FILE}" if isinstance(path, str) else path / METADATA_FILE
    try:
        return ShardedCheckpoint(path)
    except pickle.UnpicklingError as error:
        if "GLOBAL" in str(error) and _pickle_parses(io.BytesIO(metadata_bytes(path)), 1):
            raise _refusal(metadata, error) from error
        raise UnreadableCheckpoint(path, "its metadata is damaged") from error
    except UnsafeMetadata as error:
        raise ConfigError(
            f"refusing to load {metadata}: {error}; nothing was read from it."
        ) from error
    except DamagedMetadata as error:
        raise UnreadableCheckpoint(path, f"its metadata is damaged: {error}") from error
    except FileNotFoundError as error:
        if not _still_there(path):
            raise VanishedCheckpoint(path) from error
        raise UnreadableCheckpoint(path, f"an incomplete sharded checkpoint ({error})") from error
    except (OSError, EOFError, ValueError, AttributeError, TypeError) as error:
        raise UnreadableCheckpoint(path, f"damaged ({type(error).__name__}: {error})") from error


def _still_there(path) -> bool:
    """Whether a sharded checkpoint (a directory, or a URL) is still where it was listed."""
    if isinstance(path, str):
        from gatle_ignite.run.storage import place_of

        folder, name = path.rsplit("/", 1)
        return place_of(folder).exists(name)
    return path.exists()


def restore(objects: dict, state, strict: bool = True) -> None:
    """Load ``state`` (a checkpoint dict, or a sharded one) into ``objects`` (key -> object)."""
    if hasattr(state, "restore"):
        state.restore(objects)
    else:
        Checkpoint.load_objects(to_load=objects, checkpoint=state, strict=strict)


class Origin(NamedTuple):
    """What a checkpoint records of where it comes from."""

    # The id of the run that wrote it (RunIdentity's); None for a file written before it was.
    run_id: Optional[str]
    # (epoch, iteration) of its trainer state; either is None when it does not say.
    progress: tuple


def read_origin(path) -> Origin:
    """The run that wrote a checkpoint and how far its trainer had trained, read without its
    tensors (of a sharded one, only those two small entries)."""
    state = load_checkpoint_file(path, mmap=True)
    engine = _mapping(state.get("trainer") if hasattr(state, "get") else None)
    run_id = _mapping(state.get(RUN_IDENTITY_KEY) if hasattr(state, "get") else None).get("run_id")
    return Origin(run_id if isinstance(run_id, str) else None, _progress(engine))


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _progress(engine: dict) -> tuple:
    iteration = engine.get("iteration")
    length = engine.get("epoch_length")
    if not isinstance(iteration, int):
        return None, None
    if not isinstance(length, int) or length <= 0:
        return None, iteration
    # The epoch in progress, as the trainer's state.epoch reads while it trains.
    return -(-iteration // length), iteration


def _align_module_prefix(state, wanted_keys):
    """Add or strip DDP's ``module.`` prefix so a checkpoint meets the model's key names."""
    have = list(state)
    if not have or not wanted_keys or set(have) & set(wanted_keys):
        return state

    def all_prefixed(keys):
        return all(k.startswith("module.") for k in keys)

    if all_prefixed(have) and not all_prefixed(wanted_keys):
        return {k[len("module.") :]: v for k, v in state.items()}
    if all_prefixed(wanted_keys) and not all_prefixed(have):
        return {f"module.{k}": v for k, v in state.items()}
    return state


def report_weight_match(state, wanted, source) -> None:
    """Print how many tensors match; refuse a checkpoint that matches none."""
    if not isinstance(state, dict):
        return
    wanted = list(wanted)
    matched = len(set(state) & set(wanted))
    if matched:
        rank_zero_print(f"LOADED {matched}/{len(wanted)} tensors")
        return
    origin = source if isinstance(source, (str, Path)) else "an in-memory checkpoint"
    example_have = next(iter(state), None)
    example_want = wanted[0] if wanted else None
    raise ConfigError(
        f"loaded 0 of {len(wanted)} tensors from {origin}: no key matches "
        f"(checkpoint has e.g. {example_have!r}, the model wants e.g. {example_want!r}).\n"
        f"  Load a checkpoint of this model, or rename the keys before loading."
    )


def load_weights(source, module, strict=True, map_location="cpu"):
    """Load model weights from a checkpoint path, a full checkpoint dict or a bare state dict.

    A path ending in ``.safetensors`` (what ``gatle-ignite export --format safetensors``
    writes) is read with the safetensors package, the ``export`` extra.
    """
    if isinstance(source, (str, Path)):
        state = _load_or_explain(source, map_location)
    else:
        state = source
    if hasattr(state, "restore"):
        state = state.get("model")
    elif isinstance(state, dict) and "model" in state:
        state = state["model"]
    wanted = module.state_dict().keys()
    if isinstance(state, dict):
        state = _align_module_prefix(state, list(wanted))
    report_weight_match(state, wanted, source)
    return module.load_state_dict(state, strict=strict)


def _load_or_explain(path, map_location) -> Optional[dict]:
    """A file the user named: when it cannot be loaded, that is the config's error to fix."""
    if Path(path).suffix == SAFETENSORS_SUFFIX:
        return _load_safetensors(path, map_location)
    try:
        return load_checkpoint_file(path, map_location=map_location)
    except UnreadableCheckpoint as error:
        raise ConfigError(
            f"cannot load {error.path}: {error.reason}.\n"
            f"  Point at another checkpoint file; `gatle-ignite eval --ckpt latest` or `best` "
            f"skips damaged files by itself."
        ) from error


def _load_safetensors(path, map_location) -> dict:
    """A safetensors file's tensors, which by its format cannot hold code."""
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError as error:
        raise ConfigError(
            f"{path} is a safetensors file, and the safetensors package is not installed.\n"
            f'  Install the export extra: pip install "gatle-ignite[export]".'
        ) from error
    try:
        return load_file(path, device=str(map_location))
    except (OSError, SafetensorError) as error:
        raise ConfigError(
            f"cannot load {path}: not a readable safetensors file ({error}).\n"
            f"  Point at another file, or export the model again."
        ) from error
