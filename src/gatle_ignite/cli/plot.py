"""``gatle-ignite plot DIR... --out FILE.png``: runs' curves, the score first.

The history is the ``metrics.csv`` every training run writes into its save_dir (rows:
wall_time, epoch, step, name, value). The panels lead with the score (its title says which way
is better), then the other evaluation metrics, the training loss terms and the learning rates;
``perf/`` metrics go to a figure of their own (``--perf``), and a metric constant over the run
is named with its value above the panels instead of drawn. ``--metrics`` chooses the panels,
``--x`` the axis: the iteration (a panel some of whose rows carry no step falls back to the
epoch), the epoch, or the samples or tokens taken in (see ``experiments.history``). A folder of
runs, or a sweep, stands for every run below it; a sweep's study gets Optuna's own plots beside
the curves.
"""

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional, Union

from gatle_ignite.cli.plot_panels import Constant, Panel, choose_panels
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.experiments.history import (
    HISTORY_FILE,
    X_AXES,
    Point,
    read_history,
    read_history_file,
    x_position,
)
from gatle_ignite.experiments.runs import by_score, distinct_labels, read_run, runs_in

__all__ = [
    "X_AXES",
    "Point",
    "draw_histories",
    "perf_path",
    "plot_runs",
    "read_history",
    "read_history_file",
    "require_matplotlib",
    "run_plot",
    "runs_to_draw",
    "save_png",
]

# A series this short is drawn with markers, so its few epoch points stay visible.
_MARKED_POINTS = 50
_GROUP_STYLES = ("-", "--", ":", "-.")
_AXIS_LABELS = {
    "iteration": "iteration",
    "epoch": "epoch",
    "samples": "samples seen",
    "tokens": "tokens seen",
}


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


def _series_label(run_label: str, group, groups: int, runs: int, names: Sequence) -> str:
    if group is None or groups == 1:
        return run_label
    named = names[group] if group < len(names) else f"param group {group}"
    return named if runs == 1 else f"{run_label}, {named}"


def _on_steps(panel: Panel, histories: list) -> bool:
    """On the iteration axis: whether every point the panel draws carries its step."""
    return all(
        point.step is not None
        for history in histories
        for name, _group in panel.series
        for point in history.get(name, ())
    )


def _placed(points: list, position) -> tuple:
    placed = [(position(p), p.value) for p in points]
    placed = [(x, y) for x, y in placed if x is not None]
    return [x for x, _y in placed], [y for _x, y in placed]


@dataclass
class _Drawn:
    """What every panel of one figure shares: the runs, their labels, where their points lie."""

    histories: list
    labels: list
    group_names: list
    positions: list
    axis: str

    def panel_axis(self, panel: Panel) -> tuple:
        """(each run's position function, the x label) for ``panel``."""
        if self.axis == "iteration" and not _on_steps(panel, self.histories):
            # One x unit per panel: a run without steps puts the whole panel on epochs.
            epochs = [lambda point: point.epoch] * len(self.histories)
            return epochs, "epoch (no step recorded)"
        return self.positions, _AXIS_LABELS[self.axis]

    def draw(self, ax, panel: Panel) -> None:
        from matplotlib.ticker import MaxNLocator

        positions, x_label = self.panel_axis(panel)
        groups = len(panel.series)
        runs = zip(self.histories, self.labels, self.group_names, positions)
        for index, (history, label, names, position) in enumerate(runs):
            for style, (name, group) in enumerate(panel.series):
                xs, ys = _placed(history.get(name, []), position)
                if not xs:
                    continue
                # One colour per run across every panel, so a run is followed from panel to
                # panel; a line style per param group.
                ax.plot(
                    xs,
                    ys,
                    marker="o" if len(xs) <= _MARKED_POINTS else None,
                    markersize=3,
                    linewidth=1.4,
                    color=f"C{index}",
                    linestyle=_GROUP_STYLES[style % len(_GROUP_STYLES)],
                    label=_series_label(label, group, groups, len(self.histories), names),
                )
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(x_label, fontsize=8)
        if x_label.startswith(("iteration", "epoch (")):
            # Steps and epochs are counts: no tick between two of them.
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if len(ax.get_lines()) > 1:
            ax.legend(fontsize=7, loc="best")

    def constant_line(self, constant: Constant) -> str:
        values = [(label, v) for label, v in zip(self.labels, constant.values) if v is not None]
        if len({v for _label, v in values}) == 1:
            return f"{constant.title} = {values[0][1]:.5g}"
        return f"{constant.title}: " + ", ".join(f"{label} {v:.5g}" for label, v in values)


def _figure(drawn: _Drawn, panels: list, constants: list, columns: int):
    Figure = require_matplotlib("plot")
    ncols = min(columns, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    # One column is as wide as three: a single-column page shows each panel at full width.
    width = 13.5 / ncols if ncols < 3 else 4.5
    figure = Figure(figsize=(width * ncols, 3.2 * nrows), layout="constrained")
    axes = list(figure.subplots(nrows, ncols, squeeze=False).flat)
    for ax, panel in zip(axes, panels):
        drawn.draw(ax, panel)
    for ax in axes[len(panels) :]:
        ax.remove()
    if constants:
        lines = [drawn.constant_line(constant) for constant in constants]
        figure.suptitle(
            "Constant over the run: " + "; ".join(lines), x=0.01, ha="left", fontsize=8, wrap=True
        )
    return figure


class _Figures(NamedTuple):
    figure: object
    # Drawn only when asked for; perf_panels counts them either way.
    perf_figure: object
    perf_panels: int


def _draw(histories, labels, columns, group_names, scores, metrics, axis, positions, perf):
    group_names = group_names or [[] for _ in histories]
    positions = positions or [x_position("iteration", h) for h in histories]
    chosen = choose_panels(histories, scores or {}, metrics)
    drawn = _Drawn(histories, labels, group_names, positions, axis)
    if not chosen.main:
        constant = [drawn.constant_line(c) for c in chosen.constants]
        found = f" (constant: {'; '.join(constant)})" if constant else ""
        raise ConfigError(f"nothing to plot: no changing metric in {', '.join(labels)}{found}")
    figure = _figure(drawn, chosen.main, chosen.constants, columns)
    perf_figure = None
    if perf and chosen.perf:
        perf_figure = _figure(drawn, chosen.perf, chosen.perf_constants, columns)
    return _Figures(figure, perf_figure, len(chosen.perf))


def draw_histories(
    histories: list,
    labels: list,
    columns: int = 3,
    group_names: Optional[list] = None,
    scores: Optional[dict] = None,
    metrics: Optional[Sequence] = None,
    axis: str = "iteration",
    positions: Optional[list] = None,
):
    """The Figure of ``histories`` (one ``{name: [Point]}`` per run), every run overlaid in
    each panel, ``perf/`` metrics left out.

    ``group_names`` holds each run's param group names, which label its learning rates;
    ``scores`` maps a score name to its direction in words (``higher is better``);
    ``metrics`` (shell patterns) chooses the panels; ``positions`` holds each run's
    :func:`~gatle_ignite.experiments.history.x_position` on ``axis``.
    """
    options = (columns, group_names, scores, metrics, axis, positions, False)
    return _draw(histories, labels, *options).figure


def _scores(runs: list) -> dict:
    """Each score name the runs rank by, with its direction (both, where runs disagree)."""
    scores = {}
    for group in by_score(runs):
        if group.score_name is not None:
            scores.setdefault(group.score_name, []).append(group.direction)
    return {name: " / ".join(words) for name, words in scores.items()}


def _positions(axis: str, runs: list, histories: list, labels: list) -> list:
    """Each run's position function on ``axis``; a run that recorded nothing to place its
    points by is left out (None) with a warning, and none left is a config error."""
    positions = [
        x_position(axis, history, run.value("train_ds_params.bs"), run.epoch_length)
        for run, history in zip(runs, histories)
    ]
    if all(position is None for position in positions):
        raise ConfigError(
            f"--x {axis}: none of these runs recorded {_missing(axis)}.\n"
            f"  Choose --x iteration or --x epoch."
        )
    for label, position in zip(labels, positions):
        if position is None:
            warnings.warn(f"{label} recorded no {_missing(axis)}: not drawn.", stacklevel=3)
    return positions


def _missing(axis: str) -> str:
    if axis == "samples":
        return "batch size (train_ds_params.bs, or perf/samples_per_s)"
    return (
        "tokens (perf/tokens_per_s, which a run logs when its training data's info gives "
        "'tokens_per_sample')"
    )


def _plot(run_dirs, labels, metrics, x, perf) -> tuple:
    """``(figures, runs drawn)``."""
    if x not in X_AXES:
        raise ConfigError(f"--x {x!r}: choose one of {', '.join(X_AXES)}.")
    histories = [read_history(run_dir) for run_dir in run_dirs]
    runs = [read_run(run_dir) for run_dir in run_dirs]
    labels = labels or distinct_labels(runs)
    positions = _positions(x, runs, histories, labels)
    kept = [i for i, position in enumerate(positions) if position is not None]
    figures = _draw(
        [histories[i] for i in kept],
        [labels[i] for i in kept],
        3,
        [runs[i].lr_groups for i in kept],
        _scores([runs[i] for i in kept]),
        metrics,
        x,
        [positions[i] for i in kept],
        perf,
    )
    return figures, len(kept)


def perf_path(out: Union[str, os.PathLike]) -> Path:
    """Where ``--perf`` writes the perf/ panels: ``<out>_perf.png`` beside ``out``."""
    out = Path(out)
    return out.with_name(f"{out.stem}_perf{out.suffix or '.png'}")


def plot_runs(
    run_dirs: Sequence[Union[str, os.PathLike]],
    out: Union[str, os.PathLike],
    labels: Optional[list] = None,
    metrics: Optional[Sequence] = None,
    x: str = "iteration",
    perf: bool = False,
):
    """Draw the runs' curves, runs overlaid, into the PNG ``out``; returns the Figure. With
    ``perf``, the ``perf/`` panels go to :func:`perf_path` too."""
    figures, _runs = _plot(run_dirs, labels, metrics, x, perf)
    save_png(figures.figure, out)
    if figures.perf_figure is not None:
        save_png(figures.perf_figure, perf_path(out))
    return figures.figure


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


def _ranked(summaries: list, best: int) -> list:
    """The ``best`` runs with the best score, the best first; runs scored by different
    metrics or directions cannot be ranked together."""
    groups = [group for group in by_score(summaries) if group.score_name is not None]
    if len(groups) > 1:
        scores = "; ".join(f"{len(g.runs)} by {g.score_name} ({g.direction})" for g in groups)
        raise ConfigError(
            f"--best {best}: these runs are scored by different metrics or directions "
            f"({scores}), and one is never ranked against another.\n"
            f"  Give --best the runs of one score."
        )
    return [run.path for group in by_score(summaries) for run in group.runs][:best]


def runs_to_draw(dirs: Sequence[str], best: Optional[int] = None) -> tuple:
    """``(run directories, legend labels)`` for the DIR arguments of ``plot``; with ``best``,
    only the ``best`` runs with the best score, the best first."""
    paths = []
    for given in dirs:
        paths += [path for path in _expanded(given) if path not in paths]
    if any(not path.is_dir() for path in paths):
        return paths, [str(path) for path in paths]  # read_history names what is missing
    summaries = [read_run(path) for path in paths]
    if best is not None:
        paths = _ranked(summaries, best)
        summaries = [run for path in paths for run in summaries if run.path == path]
    return paths, distinct_labels(summaries)


def _study_stem(out: str, sweep_dir: Path, sweeps: int) -> str:
    stem = str(Path(out).with_suffix(""))
    return f"{stem}_{sweep_dir.name}" if sweeps > 1 else stem


def run_plot(
    run_dirs: Sequence[str],
    out: str,
    best: Optional[int] = None,
    storage: Optional[str] = None,
    metrics: Optional[Sequence] = None,
    x: str = "iteration",
    perf: bool = False,
) -> int:
    """The ``plot`` command: draw the runs, and every sweep's study beside them; say where."""
    from gatle_ignite.experiments.study import has_study, require_optuna, write_study_plots

    sweeps = [Path(d) for d in run_dirs if has_study(d)]
    for sweep_dir in sweeps:
        require_optuna(sweep_dir)  # before anything is drawn
    paths, labels = runs_to_draw(run_dirs, best)
    figures, runs = _plot(paths, labels, metrics, x, perf)
    save_png(figures.figure, out)
    chosen = f"the best {runs}" if best is not None else f"{runs}"
    panels = len(figures.figure.axes)
    print(f"PLOT: {panels} metric panel(s) of {chosen} run(s) written to {out}")
    if figures.perf_figure is not None:
        save_png(figures.perf_figure, perf_path(out))
        print(f"PERF: {figures.perf_panels} perf/ panel(s) written to {perf_path(out)}")
    elif figures.perf_panels:
        print(f"  and {figures.perf_panels} perf/ panel(s), which --perf draws apart")
    for sweep_dir in sweeps:
        stem = _study_stem(out, sweep_dir, len(sweeps))
        written = write_study_plots(sweep_dir, stem, storage)
        if written:
            print(f"STUDY: {', '.join(str(p) for p in written)}")
    return 0
