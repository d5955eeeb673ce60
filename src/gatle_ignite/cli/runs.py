"""``gatle-ignite runs DIR...``: many runs side by side, the best first, as a table or CSV."""

import csv
import json
import shlex
import sys
from typing import Optional

from gatle_ignite.experiments.runs import RunSummary, differing_params, read_runs
from gatle_ignite.run.scores import LOWER_IS_BETTER
from gatle_ignite.utils.escapes import escaped

__all__ = ["PROVENANCE_COLUMNS", "rows", "run_runs"]

# What --provenance adds, each read from the records of the processes that trained the run.
PROVENANCE_COLUMNS = (
    "commit",
    "python",
    "torch",
    "ignite",
    "gatle_ignite",
    "cuda",
    "cudnn",
    "host",
    "world_size",
    "command",
)


def _csv_cell(value) -> str:
    """A value as CSV holds it, its control characters escaped: a value from a run.json anyone
    may have written neither forges a row nor acts on the terminal."""
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return escaped(value)


def _table_cell(value) -> str:
    """A value as the table shows it: numbers to five significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.5g}"
    return _csv_cell(value)


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _commit(start: dict) -> Optional[str]:
    git = start.get("git") or {}
    if not git.get("commit"):
        return None
    code = git["commit"][:12]
    if git.get("dirty"):
        diff = git.get("diff_sha256", "")
        code += f"+dirty:{diff.split(':')[-1][:8]}" if diff else "+dirty"
    return code


def _of_start(start: dict, column: str):
    if column == "commit":
        return _commit(start)
    if column in ("host", "world_size"):
        return start.get(column)
    return (start.get("versions") or {}).get(column)


def _provenance(run: RunSummary, column: str) -> str:
    """The value for ``column``: the command that began the run, and for the rest every
    distinct value in the order the run's processes had them (``a -> b``)."""
    if column == "command":
        command = run.starts[0].get("command") if run.starts else None
        return " ".join(shlex.quote(str(w)) for w in command) if command else ""
    seen = []
    for start in run.starts:
        value = _of_start(start, column)
        if value is not None and str(value) not in seen:
            seen.append(str(value))
    return " -> ".join(seen)


def _labels(runs: list) -> list:
    """Each run's name (a trial's number), or its directory's name where names repeat."""
    names = [run.label for run in runs]
    return [
        run.label if run.trial is not None or names.count(run.label) == 1 else run.path.name
        for run in runs
    ]


def rows(runs: list, provenance: bool = False) -> list:
    """The runs as ``[{column: value}]``, in the order given, every row with the same columns:
    the run (its name or trial; its directory's name where names repeat), its state, its best
    score and that score's epoch, the epochs trained, max_epochs and the seconds, then one per
    parameter that differs between the runs, the provenance columns asked for, and the path."""
    params = differing_params(runs)
    shown_provenance = [
        column
        for column in (PROVENANCE_COLUMNS if provenance else ())
        if any(_provenance(run, column) for run in runs)
    ]
    found = []
    for run, label in zip(runs, _labels(runs)):
        row = {
            "run": label,
            "state": run.state,
            "score": run.score,
            "epoch": run.score_epoch,
            "epochs": run.epochs,
            "max_epochs": run.max_epochs,
            "seconds": None if run.seconds is None else round(run.seconds, 1),
        }
        row.update({key: run.value(key) for key in params})
        row.update({column: _provenance(run, column) for column in shown_provenance})
        row["path"] = str(run.path)
        found.append(row)
    return found


def _print_csv(found: list) -> None:
    columns = list(found[0])
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(map(escaped, columns))
    writer.writerows([_csv_cell(row[column]) for column in columns] for row in found)


def _table_line(row: dict) -> dict:
    """A row as the table shows it: epochs as trained/max_epochs and the time, after the
    score's epoch."""
    row = dict(row)
    epochs = f"{_table_cell(row.pop('epochs'))}/{_table_cell(row.pop('max_epochs'))}"
    time = _duration(row.pop("seconds"))
    line = {}
    for column, value in row.items():
        line[column] = _table_cell(value)
        if column == "epoch":
            line.update(epochs=epochs, time=time)
    return line


def _print_table(found: list, runs: list) -> None:
    lines = [_table_line(row) for row in found]
    columns = list(lines[0])
    header = {c: escaped(c) for c in columns}
    widths = {c: max(len(header[c]), *(len(line[c]) for line in lines)) for c in columns}
    print(escaped(f"{len(runs)} run(s), the best {_scores_named(runs) or 'score'} first"))
    for line in [header, *lines]:
        print("  ".join(line[c].ljust(widths[c]) for c in columns).rstrip())


def _scores_named(runs: list) -> str:
    """The runs' score names, each with its direction where lower is better."""
    names = sorted({(run.score_name, run.lower_is_better) for run in runs if run.score_name})
    return " / ".join(f"{name} ({LOWER_IS_BETTER})" if lower else name for name, lower in names)


def run_runs(dirs: list, as_csv: bool = False, provenance: bool = False) -> int:
    """The ``runs`` command: find the runs, then print them as a table or as CSV."""
    runs = read_runs(dirs)
    found = rows(runs, provenance=provenance)
    if as_csv:
        _print_csv(found)
    else:
        _print_table(found, runs)
    return 0
