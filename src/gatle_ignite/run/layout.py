"""The names of everything in a run directory, and how to read a checkpoint's name back.

A compatibility surface: the checkpoint prefixes are 0.4's, and renaming them would orphan every
existing run directory.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

__all__ = [
    "BEST_SUFFIX",
    "CHECKPOINT_EXTENSIONS",
    "CONFIG_FILE",
    "LATEST_ITER_PREFIX",
    "LATEST_PREFIX",
    "LEASE_FILE",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "METRICS_FILE",
    "OWNED_LOGS",
    "PROFILE_DIR",
    "Entry",
    "best_prefix_for",
    "checkpoint_files",
    "find_best_checkpoint",
    "find_latest_checkpoint",
    "find_resume_checkpoints",
    "is_staged_name",
    "is_staging",
    "parse_checkpoint_name",
    "resolve_eval_checkpoint",
    "score_of",
    "staging_path",
]

LATEST_PREFIX = "latest_epoch"
BEST_SUFFIX = "best_result"
# Resumable checkpoints written mid-epoch (save_every_iters, preemption).
LATEST_ITER_PREFIX = "latest_iter"
# A single file, or (sharded) a directory of one file per rank.
CHECKPOINT_EXTENSIONS = (".pt", ".dcp")

MANIFEST_FILE = "run.json"
LOCK_FILE = "run.lock"
# On object storage, where no file can be locked: the lease a writing run holds and renews.
LEASE_FILE = "run.lease"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
# The profiler's traces (the `profile` field).
PROFILE_DIR = "profile"
# What the framework's own sinks write into save_dir; replaced with the run they belong to.
OWNED_LOGS = (METRICS_FILE, "tensorboard", PROFILE_DIR)

# Everything written under a temporary name first carries this marker, so a start can tell an
# interrupted write from a user's file.
_STAGING_MARK = ".partial-"
_STAGED = re.compile(r"^\.(?P<name>.+)\.partial-[0-9a-z]+$")
# The files besides checkpoints that are written through a staging name.
_STAGED_FILES = (MANIFEST_FILE, CONFIG_FILE, METRICS_FILE)
# ignite's DiskSaver stages under tempfile's names ("tmp" and 8 characters), as 0.4 did: a file
# holding the start of a torch checkpoint (a zip archive or a pickle), or nothing yet.
_LEGACY_STAGING = re.compile(r"^tmp[a-z0-9_]{8}$")
_TORCH_STARTS = (b"PK\x03\x04", b"\x80")

_TRAILING_NUMBER = re.compile(r"_(-?\d+(?:\.\d+)?)\.[^.]+$")
_NAME = re.compile(
    r"^(?:(?P<latest>latest_epoch|latest_iter)_checkpoint_(?P<step>\d+)"
    r"|(?P<engine>[A-Za-z0-9_]*?)_?best_result_checkpoint_(?P<epoch>\d+)_(?P<score>-?[\d.]+|nan|-?inf))"
    r"(?P<ext>\.pt|\.dcp)$"
)


def best_prefix_for(prefix: str = "") -> str:
    return prefix + BEST_SUFFIX


@dataclass
class Entry:
    """One checkpoint: what its name says, and what the run's index adds.

    ``kind`` is ``latest_epoch``, ``latest_iter`` or ``best``; ``engine`` is a best file's engine
    type (``valid``), empty for a 0.4-style ``best_result_*`` name. ``epoch`` is the trainer's
    epoch when it was written (the epoch in progress, for a mid-epoch file) and ``iteration``
    its global iteration.
    """

    file: str
    kind: str
    epoch: Optional[int] = None
    iteration: Optional[int] = None
    engine: str = ""
    score: Optional[float] = None

    @property
    def resumable(self) -> bool:
        return self.kind in (LATEST_PREFIX, LATEST_ITER_PREFIX)

    def progress_key(self) -> tuple:
        """Orders entries by training progress; at one iteration an epoch's end file comes
        last, since it also holds what that epoch's evaluation changed."""
        return (self.iteration if self.iteration is not None else -1, self.kind == LATEST_PREFIX)


def parse_checkpoint_name(name: str) -> Optional[Entry]:
    """The checkpoint a file name describes, or None when it is not one of the framework's."""
    match = _NAME.match(name)
    if match is None:
        return None
    if match["latest"] == LATEST_PREFIX:
        return Entry(name, LATEST_PREFIX, epoch=int(match["step"]))
    if match["latest"] == LATEST_ITER_PREFIX:
        return Entry(name, LATEST_ITER_PREFIX, iteration=int(match["step"]))
    return Entry(
        name,
        "best",
        epoch=int(match["epoch"]),
        engine=match["engine"],
        score=float(match["score"]),
    )


def checkpoint_files(save_dir) -> list:
    """Every file or directory in ``save_dir`` named like a checkpoint, sorted by name."""
    directory = Path(save_dir)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if parse_checkpoint_name(p.name) is not None)


def score_of(path) -> Optional[float]:
    """The number just before the extension: the score of a best file, the step otherwise."""
    match = _TRAILING_NUMBER.search(Path(path).name)
    return float(match.group(1)) if match else None


def staging_path(path: Path, token: str) -> Path:
    """Where ``path`` is written before it is renamed into place."""
    return path.parent / f".{path.name}{_STAGING_MARK}{token}"


def is_staged_name(name: str) -> bool:
    """Whether ``name`` is one of the framework's staging names (nothing read but the name)."""
    staged = _STAGED.match(name)
    if staged is None:
        return False
    return staged["name"] in _STAGED_FILES or parse_checkpoint_name(staged["name"]) is not None


def is_staging(path: Path) -> bool:
    """Whether ``path`` is what an interrupted write left behind: one of the framework's staging
    names, or a file of ignite's temporary-file pattern that holds (the start of) a checkpoint.

    Nothing else qualifies, so a user's ``tmp_results/`` or ``.notes.partial-1`` stays.
    """
    path = Path(path)
    if _STAGED.match(path.name) is not None:
        return is_staged_name(path.name)
    if not _LEGACY_STAGING.match(path.name) or path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return False
    return not head or head.startswith(_TORCH_STARTS)


# ---- 0.4's finders, by name and modification time, kept for the projects that call them. The
# framework itself chooses through the run's index (gatle_ignite.run.directory). ----


def _candidates(save_dir, prefix, extension="pt") -> list:
    directory = Path(save_dir)
    if not directory.is_dir():
        return []
    return sorted(directory.glob(f"{prefix}*.{extension}"))


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
    """The file ``best`` or ``latest`` names, by the rules above (no load, no index)."""
    if load_from_ckpt == "latest":
        newest = find_resume_checkpoints(save_dir)
        return newest[0] if newest else None
    return find_best_checkpoint(save_dir, prefix=prefix)
