"""The runs under some folders, each read from its ``run.json`` (or, for a 0.4 run, its files).

A run directory is one that holds a ``run.json`` or a checkpoint; below any other folder every
run is found, at any depth (a sweep's trials, a folder of runs). Reading never loads a
checkpoint and never takes a run's lock, so it is safe while runs train. Its records are read
as the run directory reads a directory someone else wrote (``run.filesystem.read_confined``).
A run is ranked by the checkpoints its ``run.json`` indexes; a file there that it does not index
is named in a warning and never ranked (a 0.4 run has no index: its files are all there is).
"""

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.filesystem import read_confined
from gatle_ignite.run.identity import bookkeeping, flatten
from gatle_ignite.run.layout import (
    CONFIG_FILE,
    LATEST_PREFIX,
    MANIFEST_FILE,
    Entry,
    checkpoint_files,
    parse_checkpoint_name,
)
from gatle_ignite.run.manifest import checked_entry
from gatle_ignite.run.scores import LOWER_IS_BETTER, metric_value, scoring
from gatle_ignite.run.storage import holder_of, is_url, place_of

__all__ = [
    "RunSummary",
    "ScoreGroup",
    "best_first",
    "by_score",
    "compared_params",
    "differing_params",
    "direction_words",
    "distinct_labels",
    "find_runs",
    "is_run_dir",
    "read_run",
    "read_runs",
    "runs_in",
]

_NO_RUN_HINT = "Give a run's save_dir, a folder of runs or a sweep directory."


def direction_words(score_factor) -> str:
    """``higher is better``, or ``lower is better`` for a negative ``score_factor``."""
    return LOWER_IS_BETTER if (score_factor or 1) < 0 else "higher is better"


@dataclass
class RunSummary:
    """What one run directory says about its run.

    ``score`` is the best ``score_name`` value in the run's own units; ``ranking`` is the same
    times ``score_factor``, which is higher for the better run whatever the direction. A sweep's
    trial knows its ``trial`` number and its ``sweep``'s name.
    """

    path: Path
    name: str
    state: str
    trial: Optional[int] = None
    sweep: Optional[str] = None
    score_name: Optional[str] = None
    score_factor: float = 1
    score: Optional[float] = None
    ranking: Optional[float] = None
    score_epoch: Optional[int] = None
    epochs: Optional[int] = None
    max_epochs: Optional[int] = None
    epoch_length: Optional[int] = None
    seconds: Optional[float] = None
    config: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    starts: list = field(default_factory=list)
    lr_groups: list = field(default_factory=list)

    @property
    def label(self) -> str:
        """The run's name; a sweep's trial is ``<sweep>/trial <n>``, so two sweeps' trials
        differ."""
        if self.trial is None:
            return self.name
        return f"{self.sweep}/trial {self.trial}" if self.sweep else f"trial {self.trial}"

    @property
    def direction(self) -> str:
        """Which way the score improves, in words."""
        return direction_words(self.score_factor)

    def value(self, key: str):
        """The run's value of the dotted config field ``key`` (a sweep's own parameter when the
        config lacks it); None when it has neither."""
        if key in self.config:
            return self.config[key]
        return self.params.get(key)


# ---- finding runs ----


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run: a ``run.json``, or a checkpoint (a 0.4 run directory)."""
    return (path / MANIFEST_FILE).is_file() or bool(checkpoint_files(path))


def _runs_below(top: Path) -> list:
    found = []
    for folder, subfolders, _files in os.walk(top):
        here = Path(folder)
        if here != top and is_run_dir(here):
            found.append(here)
            subfolders[:] = []  # a run holds no other run
            continue
        subfolders[:] = sorted(s for s in subfolders if not s.startswith("."))
    return found


def runs_in(path) -> list:
    """``[path]`` when it is a run directory, else every run below it (none: ``[]``)."""
    path = Path(path)
    return [path] if is_run_dir(path) else _runs_below(path)


def find_runs(paths) -> list:
    """The run directories ``paths`` name: each one itself when it is a run, else every run
    below it. A path that does not exist or holds no run is a config error."""
    found = []
    for given in paths:
        if is_url(given):
            runs = place_of(given).runs_below()
            if not runs:
                raise ConfigError(f"no run in {given}: nothing below it holds a {MANIFEST_FILE}.")
            found += [run for run in runs if run not in found]
            continue
        path = Path(given)
        if not path.is_dir():
            raise ConfigError(f"{path} is not a directory.\n  {_NO_RUN_HINT}")
        runs = runs_in(path)
        if not runs:
            raise ConfigError(
                f"no run in {path}: neither it nor a folder below it holds a {MANIFEST_FILE} or "
                f"a checkpoint.\n  {_NO_RUN_HINT}"
            )
        found += [run for run in runs if run not in found]
    return found


# ---- reading one run ----


def _read_json(path: Path) -> Optional[dict]:
    try:
        data = json.loads(read_confined(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as error:
        warnings.warn(f"{path} cannot be read ({error}); ignoring it.", stacklevel=4)
        return None
    return data if isinstance(data, dict) else None


def _entries(place, manifest: Optional[dict]) -> list:
    """The run's checkpoints: its index's entries whose files exist; without an index (a 0.4
    run), every checkpoint file by its name."""
    path = place.shown()
    on_disk = set(place.checkpoint_names())
    if manifest is None:
        return [parse_checkpoint_name(name) for name in sorted(on_disk)]
    known = []
    for raw in manifest.get("checkpoints") or []:
        try:
            entry = checked_entry(raw, place.shown(MANIFEST_FILE))
        except ValueError:
            continue
        if entry.file in on_disk:
            known.append(entry)
    unindexed = sorted(on_disk - {entry.file for entry in known})
    if unindexed:
        warnings.warn(
            f"{path}: {len(unindexed)} checkpoint file(s) its {MANIFEST_FILE} does not index, "
            f"so not ranked: {', '.join(unindexed)}.",
            stacklevel=4,
        )
    return known


def _best(entries: list, score_name: Optional[str]) -> Optional[Entry]:
    """The highest-scoring best checkpoint of ``score_name``'s engine (any engine for a 0.4
    name, which carries none)."""
    engine = score_name.split("/")[0] if score_name else None
    scored = [e for e in entries if e.kind == "best" and e.score is not None]
    scored = [e for e in scored if not math.isnan(e.score)]
    ours = [e for e in scored if e.engine == engine] or [e for e in scored if not e.engine]
    if not ours:
        return None
    return max(ours, key=lambda e: (e.score, e.iteration or 0))


def _trained_epochs(manifest: Optional[dict], entries: list) -> Optional[int]:
    if manifest is None:
        epochs = [e.epoch for e in entries if e.kind == LATEST_PREFIX and e.epoch is not None]
        return max(epochs) if epochs else None
    iteration, length = _count(manifest, "trained_iteration"), _count(manifest, "epoch_length")
    if iteration is not None and length:
        return iteration // length
    return _count(manifest, "trained_epoch")


def _count(manifest: Optional[dict], name: str) -> Optional[int]:
    """A whole-number field of ``run.json``; None when it holds anything else."""
    value = (manifest or {}).get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _timestamp(text) -> Optional[datetime]:
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None


def _span(start, end) -> Optional[float]:
    begun, ended = _timestamp(start), _timestamp(end)
    if begun is None or ended is None:
        return None
    return max((ended - begun).total_seconds(), 0.0)


def _seconds(manifest: Optional[dict]) -> Optional[float]:
    """The run's wall time: the sum of every process's time on it (a queue's wait between a
    preemption and the resume is not counted); from created to updated before 0.5 recorded
    the processes."""
    if manifest is None:
        return None
    starts = manifest.get("provenance") or []
    spans = [_span(s.get("started"), s.get("until")) for s in starts if isinstance(s, dict)]
    spans = [s for s in spans if s is not None]
    if spans:
        return sum(spans)
    return _span(manifest.get("created"), manifest.get("updated"))


def _state(place, manifest: Optional[dict]) -> str:
    if manifest is None:
        return "unknown"
    state = str(manifest.get("state", "unknown"))
    # A run left "running" whose process is gone was killed.
    if state == "running" and holder_of(place) is None:
        return "interrupted"
    return state


def _sweep_trial(manifest: Optional[dict]) -> dict:
    """The sweep trial ``run.json`` says the run is (run.sweep_trial), or ``{}``."""
    sweep = (manifest or {}).get("sweep")
    return sweep if isinstance(sweep, dict) else {}


def _trial(manifest: Optional[dict]) -> Optional[int]:
    trial = _sweep_trial(manifest).get("trial")
    return trial if isinstance(trial, int) and not isinstance(trial, bool) else None


def _sweep_name(manifest: Optional[dict]) -> Optional[str]:
    """The trial's study (the sweep directory's name unless the sweep named it), or None."""
    record = _sweep_trial(manifest)
    study, sweep_dir = record.get("study"), record.get("sweep_dir")
    if isinstance(study, str) and study:
        return study
    if isinstance(sweep_dir, str) and Path(sweep_dir).name:
        return Path(sweep_dir).name
    return None


def _manifest(path: Path) -> Optional[dict]:
    manifest = _read_json(path / MANIFEST_FILE)
    if manifest is not None and not isinstance(manifest.get("config", {}), dict):
        return None
    return manifest


def read_run(path) -> RunSummary:
    """Everything ``runs`` shows of the run in ``path`` (a directory or a URL), from its files as
    they are now."""
    place = place_of(path)
    place.pull_records()
    path = path if is_url(path) else Path(path)
    here = place.path
    manifest = _manifest(here)
    config = (manifest or {}).get("config") or _read_json(here / CONFIG_FILE) or {}
    entries = _entries(place, manifest)
    score_name, factor = scoring(config, "valid")
    factor = _factor(factor)
    best = _best(entries, score_name)
    params = _sweep_trial(manifest).get("params")
    return RunSummary(
        path=path,
        name=str((manifest or {}).get("name") or config.get("name") or _last_name(path)),
        state=_state(place, manifest),
        trial=_trial(manifest),
        sweep=_sweep_name(manifest),
        score_name=score_name,
        score_factor=factor,
        score=metric_value(best.score, factor) if best is not None else None,
        ranking=best.score if best is not None else None,
        score_epoch=best.epoch if best is not None else None,
        epochs=_trained_epochs(manifest, entries),
        max_epochs=_count(manifest, "max_epochs") or config.get("max_epochs"),
        epoch_length=_whole((manifest or {}).get("epoch_length")),
        seconds=_seconds(manifest),
        config=flatten(config),
        params=params if isinstance(params, dict) else {},
        starts=[s for s in (manifest or {}).get("provenance") or [] if isinstance(s, dict)],
        lr_groups=_lr_groups(manifest),
    )


def _last_name(path) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if isinstance(path, str) else path.name


def _whole(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _factor(value) -> float:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if is_number and value else 1


def _lr_groups(manifest: Optional[dict]) -> list:
    names = (manifest or {}).get("lr_groups")
    return [str(name) for name in names] if isinstance(names, list) else []


def _rank_key(run: RunSummary) -> tuple:
    return (run.ranking is None, -(run.ranking or 0.0), run.label, str(run.path))


def best_first(runs) -> list:
    """``runs`` by score, the best first; runs without a score last."""
    return sorted(runs, key=_rank_key)


def read_runs(paths) -> list:
    """Every run ``paths`` name (see :func:`find_runs`), the best score first."""
    return best_first(read_run(path) for path in find_runs(paths))


@dataclass
class ScoreGroup:
    """Runs scored by the same metric in the same direction, the best first: the runs that
    can be ranked against each other. ``score_name`` is None for the runs without a score."""

    score_name: Optional[str]
    direction: Optional[str]
    runs: list

    @property
    def title(self) -> str:
        count = f"{len(self.runs)} run(s)"
        if self.score_name is None:
            return f"{count} without a score"
        return f"{count} scored by {self.score_name} ({self.direction}), the best first"


def by_score(runs) -> list:
    """``runs`` in groups of one score metric and direction, each ranked on its own (a loss
    and an accuracy are never ranked together); the largest group first, the runs without a
    score last."""
    groups = {}
    for run in runs:
        key = (run.score_name, run.direction) if run.score_name else (None, None)
        groups.setdefault(key, []).append(run)
    ordered = sorted(
        groups.items(), key=lambda item: (item[0][0] is None, -len(item[1]), str(item[0]))
    )
    return [
        ScoreGroup(name, direction, best_first(members)) for (name, direction), members in ordered
    ]


def distinct_labels(runs: list) -> list:
    """Each run's label; where labels repeat, its directory's name, and where those repeat
    too, its path below the folder that holds every run."""
    labels = [run.label for run in runs]
    top = os.path.commonpath([_absolute(run.path) for run in runs]) if runs else None
    for other in (lambda run: _last_name(run.path), lambda run: _below(run.path, top)):
        labels = [
            other(run) if labels.count(label) > 1 else label for run, label in zip(runs, labels)
        ]
    return labels


def _absolute(path) -> str:
    """A run's path in full; a URL as it is."""
    return path if isinstance(path, str) else str(path.absolute())


def _below(path, top: Optional[str]) -> str:
    relative = os.path.relpath(_absolute(path), top) if top is not None else str(path)
    return str(path) if relative == "." else relative


# ---- what sets runs apart ----


def _comparable(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def differing_params(runs: list) -> list:
    """The dotted config fields whose values are not the same in every run (fields that never
    change training left out), and every parameter a sweep set; sorted."""
    configured = [run for run in runs if run.config]
    keys = set().union(*(run.config for run in configured)) if configured else set()
    differing = {
        key
        for key in keys
        if not bookkeeping(key)
        and len({_comparable(run.config.get(key)) for run in configured}) > 1
    }
    swept = set().union(*(run.params for run in runs)) if runs else set()
    return sorted(differing | swept)


def _swept(runs: list) -> list:
    return list(dict.fromkeys(key for run in runs for key in run.params))


def compared_params(runs: list, everything: bool = False) -> list:
    """The fields that set ``runs`` apart: every parameter a sweep set, then the fields every
    run sets, to values not all the same, in the config's order (fields that never change
    training left out). With ``everything``, :func:`differing_params`: a field only some runs
    set (another loss term, another model's parameter) too."""
    if everything:
        return differing_params(runs)
    swept = _swept(runs)
    configured = [run for run in runs if run.config]
    if not configured:
        return swept
    differing = [
        key
        for key in configured[0].config
        if key not in swept
        and not bookkeeping(key)
        and all(run.config.get(key) is not None for run in configured)
        and len({_comparable(run.config[key]) for run in configured}) > 1
    ]
    return swept + differing
