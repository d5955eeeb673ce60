"""The table ``gatle-ignite runs`` prints for one group of comparable runs.

A person reads it on a terminal: the run, its state, its score (headed by the score's name),
the epoch of that score, the epochs trained, the time, then the few fields whose values set the
runs apart, under short names (``lr`` for ``optimizer_params.lr``, ``model`` for
``model_name``, a dotted path shown by its last part), as many as the terminal's width holds;
the others are counted under the table. ``--all`` shows every differing field by its dotted
key, full values and the run's path, whatever the width.
"""

import json
import re
from typing import Optional

from gatle_ignite.experiments.runs import ScoreGroup, compared_params, distinct_labels
from gatle_ignite.utils.escapes import escaped

__all__ = ["duration", "short_names", "table_lines"]

_GAP = "  "
# A module path such as examples.synthetic.models.mlp: the table shows its last part.
_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def _cell(value, full: bool = False) -> str:
    """A value as the table shows it: numbers to five significant digits, a module path by
    its last part unless ``full``, control characters escaped (a run.json anyone may have
    written neither forges a line nor acts on the terminal)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.5g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    if not full and isinstance(value, str) and _DOTTED_PATH.fullmatch(value):
        return value.rsplit(".", 1)[1]
    return escaped(value)


def duration(seconds: Optional[float]) -> str:
    """``12s``, ``3m05s``, ``2h07m``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _is_path_field(key: str, runs: list) -> bool:
    """Whether the field names code (a module path) in the runs, rather than a number."""
    values = [run.value(key) for run in runs]
    return any(isinstance(v, str) and _DOTTED_PATH.fullmatch(v) for v in values)


def short_names(keys: list, path_fields: set = frozenset()) -> dict:
    """Each dotted key's shortest trailing part that no other key shares: ``lr`` for
    ``optimizer_params.lr``; ``model`` for ``model_name`` (a field naming code loses its
    ``_name``)."""

    def tail(key: str, parts: int) -> str:
        name = ".".join(key.split(".")[-parts:])
        if key in path_fields and name.endswith("_name") and name != "_name":
            name = name[: -len("_name")]
        return name

    parts = dict.fromkeys(keys, 1)
    while True:
        names = {key: tail(key, parts[key]) for key in keys}
        taken = list(names.values())
        clashing = [
            k for k in keys if taken.count(names[k]) > 1 and tail(k, parts[k] + 1) != names[k]
        ]
        if not clashing:
            return names
        for key in clashing:
            parts[key] += 1


def _fixed_columns(group: ScoreGroup) -> list:
    runs = group.runs
    return [
        ("run", [escaped(label) for label in distinct_labels(runs)]),
        ("state", [escaped(run.state) for run in runs]),
        (escaped(group.score_name or "score"), [_cell(run.score) for run in runs]),
        ("epoch", [_cell(run.score_epoch) for run in runs]),
        ("epochs", [f"{_cell(run.epochs)}/{_cell(run.max_epochs)}" for run in runs]),
        ("time", [duration(run.seconds) for run in runs]),
    ]


def _param_columns(runs: list, everything: bool) -> list:
    """The fields that set the runs apart: with ``everything``, every differing one by its
    dotted key; else those every run sets, the swept first and the module paths last, under
    short names."""
    keys = compared_params(runs, everything)
    if everything:
        return [(escaped(key), [_cell(run.value(key), full=True) for run in runs]) for key in keys]
    swept = {key for run in runs for key in run.params}
    paths = {key for key in keys if _is_path_field(key, runs)}
    keys = sorted(keys, key=lambda key: (key not in swept, key in paths))
    names = short_names(keys, paths)
    return [(escaped(names[key]), [_cell(run.value(key)) for run in runs]) for key in keys]


def _width(column: tuple) -> int:
    header, cells = column
    return max(len(header), *(len(cell) for cell in cells))


def _fitting(shown: list, optional: list, width: Optional[int]) -> list:
    """As many of ``optional``, from the left, as ``width`` holds beside ``shown``."""
    if width is None:
        return optional
    used = sum(_width(c) for c in shown) + len(_GAP) * (len(shown) - 1)
    for index, column in enumerate(optional):
        used += len(_GAP) + _width(column)
        if used > width:
            return optional[:index]
    return optional


def table_lines(
    group: ScoreGroup, extra: Optional[dict] = None, everything: bool = False, width=None
) -> list:
    """The group's table as lines: the header, then a line per run, the best first.

    ``extra`` holds columns asked for by name (``{header: [cell per run]}``), always shown,
    last; ``width`` (characters) drops the differing fields that do not fit, from the right,
    and says how many; ``everything`` shows them all, and the runs' paths.
    """
    runs = group.runs
    fixed, extra = _fixed_columns(group), list((extra or {}).items())
    params = _param_columns(runs, everything)
    if everything:
        params.append(("path", [escaped(run.path) for run in runs]))
    fitting = _fitting(fixed + extra, params, None if everything else width)
    kept, dropped = fixed + fitting + extra, len(params) - len(fitting)
    widths = [_width(column) for column in kept]
    lines = []
    for row in range(-1, len(runs)):
        cells = [header if row < 0 else cells[row] for header, cells in kept]
        lines.append(_GAP.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    if dropped:
        lines.append(f"+{dropped} more column(s): --all shows every differing field")
    return lines
