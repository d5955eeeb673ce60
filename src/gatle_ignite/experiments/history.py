"""A run's metric history (the ``metrics.csv`` every training run writes) and where each of its
points lies on a chosen x axis.

The rows are ``wall_time, epoch, step, name, value``; ``step`` is the trainer's global
iteration. On the ``samples`` and ``tokens`` axes a point lies at its iteration times what one
iteration takes in; that is read from what the run recorded: the samples of one iteration are
the config's ``train_ds_params.bs`` (the batch over every rank), else the ``perf/`` rows
(``perf/samples_per_s`` times ``perf/train_time_s`` over the epoch's iterations); the tokens of
a sample are ``perf/tokens_per_s`` over ``perf/samples_per_s``, which only a run whose training
data gave ``info["tokens_per_sample"]`` logged.
"""

import csv
import io
import os
from collections import defaultdict
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Union

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.filesystem import UnsafeFile, read_confined

__all__ = [
    "HISTORY_FILE",
    "X_AXES",
    "Point",
    "read_history",
    "read_history_file",
    "x_position",
]

HISTORY_FILE = "metrics.csv"
# The most of a metrics.csv read: some 4 million rows, far beyond a long run logging every few
# iterations; and the bound on what a planted one costs.
HISTORY_LIMIT = 256 << 20
_COLUMNS = ("epoch", "step", "name", "value")
# What a point's x can be: the global iteration, the epoch (a fraction within one), or what the
# run had taken in by then.
X_AXES = ("iteration", "epoch", "samples", "tokens")


class Point(NamedTuple):
    step: Optional[int]
    epoch: Optional[int]
    value: float


def _whole_number(cell: str) -> Optional[int]:
    return int(float(cell)) if cell else None


def read_history(run_dir: Union[str, os.PathLike]) -> dict:
    """The run's ``metrics.csv`` as ``{metric name: [Point, ...]}``."""
    if not os.path.exists(run_dir):
        raise ConfigError(f"{run_dir} does not exist.\n  Give the save_dir of a training run.")
    path = Path(run_dir) / HISTORY_FILE
    if not path.is_file():
        raise ConfigError(
            f"{run_dir} has no {HISTORY_FILE}.\n"
            f"  Give the save_dir of a training run: every run writes its {HISTORY_FILE} there."
        )
    return read_history_file(path)


def read_history_file(path: Union[str, os.PathLike]) -> dict:
    """``{metric name: [Point, ...]}`` in file order; non-numeric values are left out.

    Read as a run directory is read (``run.filesystem.read_confined``): a regular file of at
    most ``HISTORY_LIMIT`` bytes, never through a link out of its directory.
    """
    history = defaultdict(list)
    try:
        text = read_confined(path, HISTORY_LIMIT).decode("utf-8")
    except (UnsafeFile, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} cannot be read as a metrics history: {error}.") from None
    rows = csv.DictReader(io.StringIO(text, newline=""))
    try:
        if not set(_COLUMNS) <= set(rows.fieldnames or ()):
            raise ConfigError(
                f"{path} is not a metrics history: its header is {rows.fieldnames}, and it "
                f"needs the columns {', '.join(_COLUMNS)}."
            )
        for row in rows:
            point = _point(row)
            if point is not None:
                history[row["name"]].append(point)
    except csv.Error as error:
        raise ConfigError(f"{path} is not a readable metrics history: {error}.") from None
    return dict(history)


def _point(row: dict) -> Optional[Point]:
    """The row's point; None for a value that is not a number (a list-valued metric, such as a
    confusion matrix, has no curve) or a row whose step or epoch is not one."""
    try:
        return Point(_whole_number(row["step"]), _whole_number(row["epoch"]), float(row["value"]))
    except (TypeError, ValueError, OverflowError):
        return None


def _at_step(history: dict, name: str) -> dict:
    return {p.step: p.value for p in history.get(name, ()) if p.step is not None}


def _samples_per_iteration(batch, history: dict, epoch_length) -> Optional[float]:
    """The samples one iteration takes in (every rank's together), as the run recorded it."""
    if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0:
        return float(batch)
    if not epoch_length:
        return None
    rates, times = _at_step(history, "perf/samples_per_s"), _at_step(history, "perf/train_time_s")
    for step in sorted(set(rates) & set(times)):
        # An epoch's record: its samples over its training time, at its last iteration.
        return rates[step] * times[step] / epoch_length
    return None


def _tokens_per_sample(history: dict) -> Optional[float]:
    samples, tokens = (
        _at_step(history, "perf/samples_per_s"),
        _at_step(history, "perf/tokens_per_s"),
    )
    for step in sorted(set(samples) & set(tokens)):
        if samples[step] > 0:
            return tokens[step] / samples[step]
    return None


def x_position(
    axis: str, history: dict, batch_size=None, epoch_length: Optional[int] = None
) -> Optional[Callable[[Point], Optional[float]]]:
    """Where a point of this run lies on ``axis`` (None for a point that cannot be placed), or
    None when the run recorded nothing to place its points by (no tokens, no batch size).
    ``batch_size`` is the config's ``train_ds_params.bs``, the batch over every rank.

    ``iteration`` is the point's step; ``epoch`` its step over the epoch's length (an epoch
    metric lies on its whole epoch), or its epoch where the length or the step is unknown.
    """
    if axis == "iteration":
        return lambda point: point.step
    if axis == "epoch":
        if not epoch_length:
            return lambda point: point.epoch
        return lambda p: p.step / epoch_length if p.step is not None else p.epoch
    per_iteration = _samples_per_iteration(batch_size, history, epoch_length)
    if per_iteration is not None and axis == "tokens":
        per_sample = _tokens_per_sample(history)
        per_iteration = per_iteration * per_sample if per_sample is not None else None
    if per_iteration is None:
        return None
    return lambda point: point.step * per_iteration if point.step is not None else None
