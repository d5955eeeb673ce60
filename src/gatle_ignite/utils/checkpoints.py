"""Checkpoint files: their names, how to find them, and how to load weights from them safely."""

import pickle
import re
from pathlib import Path
from typing import Optional

import torch

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.utils.dist import rank_zero_print

__all__ = [
    "BEST_SUFFIX",
    "LATEST_ITER_PREFIX",
    "LATEST_PREFIX",
    "RunMeta",
    "best_prefix_for",
    "find_best_checkpoint",
    "find_latest_checkpoint",
    "find_resume_checkpoints",
    "load_checkpoint_file",
    "load_weights",
    "report_weight_match",
    "resolve_eval_checkpoint",
    "score_of",
]

# A compatibility surface: renaming these orphans every existing run directory.
LATEST_PREFIX = "latest_epoch"
BEST_SUFFIX = "best_result"
# Resumable checkpoints written mid-epoch (save_every_iters, preemption).
LATEST_ITER_PREFIX = "latest_iter"

_TRAILING_NUMBER = re.compile(r"_(-?\d+(?:\.\d+)?)\.[^.]+$")


def best_prefix_for(prefix: str = "") -> str:
    return prefix + BEST_SUFFIX


class RunMeta:
    """Records max_epochs in each checkpoint, so a resume can warn about a stale LR schedule."""

    def __init__(self, max_epochs):
        self.max_epochs = max_epochs
        self.restored_max_epochs = None

    def state_dict(self) -> dict:
        return {"max_epochs": self.max_epochs}

    def load_state_dict(self, state_dict) -> None:
        self.restored_max_epochs = state_dict.get("max_epochs")


def _candidates(save_dir, prefix, extension="pt") -> list:
    directory = Path(save_dir)
    if not directory.is_dir():
        return []
    return sorted(directory.glob(f"{prefix}*.{extension}"))


def score_of(path) -> Optional[float]:
    """The number just before the extension: the score of a best file, the step otherwise."""
    match = _TRAILING_NUMBER.search(Path(path).name)
    return float(match.group(1)) if match else None


def _mtime(path) -> float:
    return Path(path).stat().st_mtime


def find_latest_checkpoint(save_dir, extension="pt") -> Optional[Path]:
    """The newest ``latest_epoch*`` file, by modification time."""
    files = _candidates(save_dir, LATEST_PREFIX, extension)
    return max(files, key=_mtime) if files else None


def find_resume_checkpoints(save_dir, extension="pt") -> list:
    """Every resumable checkpoint (``latest_epoch*`` and ``latest_iter*``), newest first."""
    files = _candidates(save_dir, LATEST_PREFIX, extension)
    files += _candidates(save_dir, LATEST_ITER_PREFIX, extension)
    return sorted(files, key=_mtime, reverse=True)


def find_best_checkpoint(save_dir, prefix="", extension="pt") -> Optional[Path]:
    """The highest-scoring ``<prefix>best_result*`` file; ties go to the newest."""
    files = _candidates(save_dir, best_prefix_for(prefix), extension)
    scored = [(score_of(f), _mtime(f), f) for f in files]
    scored = [entry for entry in scored if entry[0] is not None]
    if scored:
        return max(scored, key=lambda entry: entry[:2])[2]
    return max(files, key=_mtime) if files else None


def resolve_eval_checkpoint(save_dir, load_from_ckpt="best", prefix="valid_") -> Optional[Path]:
    """The file ``gatle-ignite eval`` loads: the best one, or the newest resumable one.

    "latest" is the checkpoint a resume would continue from, a ``latest_iter`` file included.
    """
    if load_from_ckpt == "latest":
        newest = find_resume_checkpoints(save_dir)
        return newest[0] if newest else None
    return find_best_checkpoint(save_dir, prefix=prefix)


def load_checkpoint_file(path, map_location="cpu"):
    """``torch.load`` with ``weights_only=True``: a checkpoint can never run code on load."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ConfigError(
            f"refusing to load {path}: it holds objects other than tensors and plain Python "
            f"values, which could run code when unpickled.\n"
            f"  Nothing was executed. Only load checkpoints you trust, re-saved as plain state "
            f"dicts. ({str(error).splitlines()[0]})"
        ) from error


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
    """Load model weights from a checkpoint path, a full checkpoint dict or a bare state dict."""
    if isinstance(source, (str, Path)):
        state = load_checkpoint_file(source, map_location=map_location)
    else:
        state = source
    if isinstance(state, dict) and "model" in state:
        state = state["model"]
    wanted = module.state_dict().keys()
    if isinstance(state, dict):
        state = _align_module_prefix(state, list(wanted))
    report_weight_match(state, wanted, source)
    return module.load_state_dict(state, strict=strict)
