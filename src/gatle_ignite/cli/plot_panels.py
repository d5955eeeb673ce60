"""Which panels ``gatle-ignite plot`` draws, in which order, and what it only names.

The score leads (its title says which way is better), then the other evaluation metrics, the
training loss and its terms, the learning rates (one panel, a line per param group), the other
training metrics; the ``perf/`` metrics go to a figure of their own. A metric that keeps one
value over every run drawn is no panel: the figure names it with its value. A metric whose
points equal another's in every run is drawn once, both names in the title.
"""

import fnmatch
import re
from collections import defaultdict
from typing import NamedTuple, Optional

from gatle_ignite.dispatch import ConfigError

__all__ = ["Constant", "Panel", "Panels", "choose_panels"]

# The learning rate of each param group (train/lr_0, train/lr_1, ...): one panel, a line each.
_LR_GROUP = re.compile(r"(?P<panel>.+/lr)_(?P<group>\d+)")
PERF_PREFIX = "perf/"


class Panel(NamedTuple):
    title: str
    # (metric name, param group or None) of each series the panel draws.
    series: tuple


class Constant(NamedTuple):
    """A metric with one value over each run: its name(s), and that value in each run (None
    where the run did not log it)."""

    title: str
    values: tuple


class Panels(NamedTuple):
    main: list
    perf: list
    # Constants of the main figure and of the perf figure.
    constants: list
    perf_constants: list


def _grouped_lrs(names: list) -> dict:
    grouped = defaultdict(list)
    for name in names:
        lr = _LR_GROUP.fullmatch(name)
        if lr:
            grouped[lr["panel"]].append((name, int(lr["group"])))
    return {title: tuple(sorted(members, key=lambda m: m[1])) for title, members in grouped.items()}


def _merged(names: list, histories: list) -> list:
    """One panel per metric, a metric whose every run's points equal another's only named in
    that one's title (a single loss term's ``loss_ce_avg`` is ``loss_avg`` again)."""
    seen = {}
    # Shorter names first: of two equal curves the shorter name (loss_avg) is the one drawn.
    for name in sorted(names, key=lambda n: (len(n), n)):
        points = tuple(tuple(history.get(name, ())) for history in histories)
        seen.setdefault(points, []).append(name)
    return [
        Panel(same[0] + "".join(f" = {other}" for other in same[1:]), ((same[0], None),))
        for same in seen.values()
    ]


def _rank(panel: Panel, scores: dict) -> tuple:
    """Where a panel goes: the score, the other metrics of the score's engine, the other
    evaluation metrics, the training loss terms, the learning rates, the other training
    metrics, perf."""
    name = panel.series[0][0]
    if name in scores:
        return (0, list(scores).index(name), "")
    if name.startswith(PERF_PREFIX):
        return (6, 0, panel.title)
    if not name.startswith("train/"):
        engines = {score.split("/")[0] for score in scores}
        if "/" not in name:
            return (5, 0, panel.title)
        return (1 if name.split("/")[0] in engines else 2, 0, panel.title)
    if name == "train/loss" or name.startswith("train/loss_"):
        return (3, 0, panel.title)
    return (4 if _LR_GROUP.fullmatch(name) else 5, 0, panel.title)


def _run_values(panel: Panel, history: dict) -> set:
    return {p.value for name, _group in panel.series for p in history.get(name, ())}


def _constant(panel: Panel, histories: list) -> Optional[Constant]:
    """The panel as a Constant when each run's points all hold one value, else None."""
    values = [_run_values(panel, history) for history in histories]
    if any(len(found) > 1 for found in values) or not any(values):
        return None
    return Constant(panel.title, tuple(next(iter(found), None) for found in values))


def _chosen(panel: Panel, patterns) -> bool:
    names = [panel.title, *(name for name, _group in panel.series)]
    return any(fnmatch.fnmatchcase(name, pattern) for name in names for pattern in patterns)


def _check_patterns(patterns, names: list) -> None:
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ConfigError(
                f"--metrics {pattern!r} matches no metric of these runs.\n"
                f"  Their metrics: {', '.join(names)}."
            )


def choose_panels(histories: list, scores: dict, metrics=None) -> Panels:
    """The panels of ``histories`` (one ``{name: [Point]}`` per run) in the order drawn.

    ``scores`` maps each score name to its direction in words (``higher is better``);
    ``metrics``, shell patterns, keeps only the panels of the metrics they match (perf ones
    included, in the main figure).
    """
    names = sorted({name for history in histories for name in history})
    grouped = _grouped_lrs(names)
    in_groups = {name for members in grouped.values() for name, _ in members}
    panels = _merged([n for n in names if n not in in_groups], histories)
    panels += [Panel(title, members) for title, members in grouped.items()]
    if metrics:
        _check_patterns(metrics, sorted({*names, *grouped}))
        panels = [panel for panel in panels if _chosen(panel, metrics)]
    panels.sort(key=lambda panel: _rank(panel, scores))
    chosen = Panels([], [], [], [])
    for panel in panels:
        first = panel.series[0][0]
        is_perf = first.startswith(PERF_PREFIX) and not metrics
        constant = None if first in scores else _constant(panel, histories)
        if constant is not None:
            (chosen.perf_constants if is_perf else chosen.constants).append(constant)
            continue
        if first in scores:
            panel = panel._replace(title=f"{panel.title} (score, {scores[first]})")
        (chosen.perf if is_perf else chosen.main).append(panel)
    return chosen
