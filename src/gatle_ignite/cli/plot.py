"""``gatle-ignite plot DIR... --out FILE.png``: runs' curves, one panel per metric.

The history is the ``metrics.csv`` every training run writes into its save_dir (rows:
wall_time, epoch, step, name, value). A panel's x axis is the global iteration (``step``) when
every row it draws has one; rows written before the epoch metrics carried a step fall back to
the epoch. A folder of runs, or a sweep, stands for every run below it; a sweep's study gets
Optuna's own plots beside the curves.
"""

import csv
import io
import math
import os
import re
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Optional, Union

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.experiments.runs import best_first, read_run, runs_in
from gatle_ignite.run.filesystem import UnsafeFile, read_confined
from gatle_ignite.run.scores import LOWER_IS_BETTER

__all__ = [
    "Point",
    "draw_histories",
    "plot_runs",
    "read_history",
    "read_history_file",
    "require_matplotlib",
    "run_plot",
    "runs_to_draw",
    "save_png",
]

HISTORY_FILE = "metrics.csv"
# The most of a metrics.csv read: some 4 million rows, far beyond a long run logging every few
# iterations; and the bound on what a planted one costs.
HISTORY_LIMIT = 256 << 20
_COLUMNS = ("epoch", "step", "name", "value")
# A series this short is drawn with markers, so its few epoch points stay visible.
_MARKED_POINTS = 50


class Point(NamedTuple):
    step: Optional[int]
    epoch: Optional[int]
    value: float


def require_matplotlib(command: str):
    """matplotlib's ``Figure``, or a config error naming the extra that installs it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ConfigError(
            f"{command} draws with matplotlib, which is not installed ({error}).\n"
            f'  Install it with `pip install "gatle-ignite[plot]"`.'
        ) from error
    return Figure


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


def _labels(run_dirs: Sequence, trials: Optional[dict] = None) -> list:
    """Each run's legend entry: its trial, else its directory name, or its path where names
    repeat."""
    trials = trials or {}
    names = [Path(run_dir).name for run_dir in run_dirs]
    return [
        trials.get(run_dir) or (name if names.count(name) == 1 else str(run_dir))
        for name, run_dir in zip(names, run_dirs)
    ]


def _all_have_steps(series: list) -> bool:
    return all(point.step is not None for points in series for point in points)


def _xy(points: list, by_step: bool) -> tuple:
    kept = [p for p in points if (p.step if by_step else p.epoch) is not None]
    return [p.step if by_step else p.epoch for p in kept], [p.value for p in kept]


# The learning rate of each param group (train/lr_0, train/lr_1, ...): one panel, a line each.
_LR_GROUP = re.compile(r"(?P<panel>.+/lr)_(?P<group>\d+)")
_GROUP_STYLES = ("-", "--", ":", "-.")


class _Panel(NamedTuple):
    title: str
    # (metric name, param group or None) of each series the panel draws.
    series: tuple


def _panels(histories: list) -> list:
    """The panels to draw, in title order: one per metric, the param groups' learning rates
    together, and a metric whose every run's points equal another's only named in its title
    (a single loss term's ``loss_ce_avg`` is ``loss_avg`` again)."""
    names = sorted({name for history in histories for name in history})
    grouped, seen = defaultdict(list), {}
    for name in names:
        lr = _LR_GROUP.fullmatch(name)
        if lr:
            grouped[lr["panel"]].append((name, int(lr["group"])))
    in_groups = {name for members in grouped.values() for name, _ in members}
    # Shorter names first: of two equal curves the shorter name (loss_avg) is the one drawn.
    for name in sorted(set(names) - in_groups, key=lambda n: (len(n), n)):
        points = tuple(tuple(history.get(name, ())) for history in histories)
        if points in seen:
            seen[points].append(name)
            continue
        seen[points] = [name]
    panels = [
        _Panel(same[0] + "".join(f" = {other}" for other in same[1:]), ((same[0], None),))
        for same in seen.values()
    ]
    panels += [
        _Panel(title, tuple(sorted(members, key=lambda m: m[1])))
        for title, members in grouped.items()
    ]
    return sorted(panels)


def _series_label(run_label: str, group, groups: int, runs: int, names: Sequence) -> str:
    if group is None or groups == 1:
        return run_label
    named = names[group] if group < len(names) else f"param group {group}"
    return named if runs == 1 else f"{run_label}, {named}"


def _draw_panel(
    ax, panel: _Panel, histories: list, labels: list, group_names: list, lower: frozenset
) -> None:
    from matplotlib.ticker import MaxNLocator

    series = [history.get(name, []) for history in histories for name, _ in panel.series]
    by_step = _all_have_steps(series)
    groups = len(panel.series)
    for index, (history, label, names) in enumerate(zip(histories, labels, group_names)):
        for position, (name, group) in enumerate(panel.series):
            points = history.get(name, [])
            if not points:
                continue
            xs, ys = _xy(points, by_step)
            marker = "o" if len(xs) <= _MARKED_POINTS else None
            # One colour per run across every panel, so a run is followed from panel to
            # panel; a line style per param group.
            ax.plot(
                xs,
                ys,
                marker=marker,
                markersize=3,
                linewidth=1.4,
                color=f"C{index}",
                linestyle=_GROUP_STYLES[position % len(_GROUP_STYLES)],
                label=_series_label(label, group, groups, len(histories), names),
            )
    # A score kept at its minimum says so: its curve should go down.
    said = f" ({LOWER_IS_BETTER})" if any(name in lower for name, _ in panel.series) else ""
    ax.set_title(panel.title + said, fontsize=10)
    ax.set_xlabel("iteration" if by_step else "epoch (no step recorded)", fontsize=8)
    # Steps and epochs are counts: no tick between two of them.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def draw_histories(
    histories: list,
    labels: list,
    columns: int = 3,
    group_names: Optional[list] = None,
    lower_is_better: Sequence[str] = (),
):
    """A Figure with one panel per metric, every history overlaid in each; ``group_names``
    holds each run's param group names, which label its learning rates; the panels of the
    metrics in ``lower_is_better`` (scores kept at their minimum) say so."""
    group_names = group_names or [[] for _ in histories]
    Figure = require_matplotlib("plot")
    panels = _panels(histories)
    if not panels:
        raise ConfigError(f"nothing to plot: no numeric metric in {', '.join(labels)}")
    ncols = min(columns, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    # One column is as wide as three: a single-column page shows each panel at full width.
    width = 13.5 / ncols if ncols < 3 else 4.5
    figure = Figure(figsize=(width * ncols, 3.2 * nrows))
    axes = list(figure.subplots(nrows, ncols, squeeze=False).flat)
    for ax, panel in zip(axes, panels):
        _draw_panel(ax, panel, histories, labels, group_names, frozenset(lower_is_better))
    for ax in axes[len(panels) :]:
        ax.remove()
    figure.tight_layout()
    return figure


def plot_runs(
    run_dirs: Sequence[Union[str, os.PathLike]],
    out: Union[str, os.PathLike],
    labels: Optional[list] = None,
):
    """Draw every metric of every run, runs overlaid, write ``out`` as a PNG; returns the Figure."""
    histories = [read_history(run_dir) for run_dir in run_dirs]
    runs = [read_run(run_dir) for run_dir in run_dirs]
    lower = [run.score_name for run in runs if run.score_name and run.lower_is_better]
    figure = draw_histories(
        histories,
        labels or _labels(run_dirs),
        group_names=[run.lr_groups for run in runs],
        lower_is_better=lower,
    )
    save_png(figure, out)
    return figure


def save_png(figure, out: Union[str, os.PathLike]) -> None:
    """Write ``figure`` to exactly ``out`` (matplotlib would append .png to a bare name)."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=100)


def _expanded(given) -> list:
    """The runs a DIR argument stands for: itself when it is a run (or holds a history),
    else the runs below it that have a history."""
    path = Path(given)
    if not path.is_dir() or (path / HISTORY_FILE).is_file():
        return [path]
    found = runs_in(path)
    if found in ([], [path]):
        return [path]
    drawn = [run for run in found if (run / HISTORY_FILE).is_file()]
    for run in found:
        if run not in drawn:
            warnings.warn(f"{run} has no {HISTORY_FILE}, so it is not drawn.", stacklevel=3)
    if not drawn:
        raise ConfigError(
            f"no run in {path} has a {HISTORY_FILE}.\n"
            f"  Give a run's save_dir, a folder of runs or a sweep directory."
        )
    return drawn


def runs_to_draw(dirs: Sequence[str], best: Optional[int] = None) -> tuple:
    """``(run directories, legend labels)`` for the DIR arguments of ``plot``; with ``best``,
    only the ``best`` runs with the highest score, the best first."""
    paths = []
    for given in dirs:
        paths += [path for path in _expanded(given) if path not in paths]
    summaries = {path: read_run(path) for path in paths if path.is_dir()}
    if best is not None:
        paths = [run.path for run in best_first(summaries.values())][:best]
    trials = {path: run.label for path, run in summaries.items() if run.trial is not None}
    return paths, _labels(paths, trials)


def _study_stem(out: str, sweep_dir: Path, sweeps: int) -> str:
    stem = str(Path(out).with_suffix(""))
    return f"{stem}_{sweep_dir.name}" if sweeps > 1 else stem


def run_plot(
    run_dirs: Sequence[str], out: str, best: Optional[int] = None, storage: Optional[str] = None
) -> int:
    """The ``plot`` command: draw the runs, and every sweep's study beside them; say where."""
    from gatle_ignite.experiments.study import has_study, require_optuna, write_study_plots

    sweeps = [Path(d) for d in run_dirs if has_study(d)]
    for sweep_dir in sweeps:
        require_optuna(sweep_dir)  # before anything is drawn
    paths, labels = runs_to_draw(run_dirs, best)
    figure = plot_runs(paths, out, labels)
    chosen = f"the best {len(paths)}" if best is not None else f"{len(paths)}"
    print(f"PLOT: {len(figure.axes)} metric panel(s) of {chosen} run(s) written to {out}")
    for sweep_dir in sweeps:
        stem = _study_stem(out, sweep_dir, len(sweeps))
        written = write_study_plots(sweep_dir, stem, storage)
        if written:
            print(f"STUDY: {', '.join(str(p) for p in written)}")
    return 0
