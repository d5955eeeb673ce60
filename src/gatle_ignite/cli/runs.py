"""``gatle-ignite runs DIR...``: many runs side by side, the best first, as tables or CSV.

Runs scored by different metrics, or in different directions, are never ranked together: the
table has one part per score metric and direction; the CSV keeps one row per run and every
differing field.
"""

import csv
import json
import shlex
import shutil
import sys
from typing import Optional

from gatle_ignite.cli.runs_table import table_lines
from gatle_ignite.experiments.runs import (
    RunSummary,
    by_score,
    differing_params,
    distinct_labels,
    read_runs,
)
from gatle_ignite.utils.escapes import escaped

__all__ = ["PROVENANCE_COLUMNS", "provenance_of", "rows", "run_runs"]

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


def provenance_of(run: RunSummary, column: str) -> str:
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


def rows(runs: list, provenance: bool = False) -> list:
    """The runs as ``[{column: value}]``, in the order given, every row with the same columns:
    the run (its name or trial; its directory's name where names repeat), its state, its best
    score and that score's epoch, the epochs trained, max_epochs and the seconds, then one per
    parameter that differs between the runs, the provenance columns asked for, and the path."""
    params = differing_params(runs)
    shown_provenance = _provenance_columns(runs, provenance)
    found = []
    for run, label in zip(runs, distinct_labels(runs)):
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
        row.update({column: provenance_of(run, column) for column in shown_provenance})
        row["path"] = str(run.path)
        found.append(row)
    return found


def _provenance_columns(runs: list, provenance: bool) -> list:
    return [
        column
        for column in (PROVENANCE_COLUMNS if provenance else ())
        if any(provenance_of(run, column) for run in runs)
    ]


def _print_csv(found: list) -> None:
    columns = list(found[0])
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(map(escaped, columns))
    writer.writerows([_csv_cell(row[column]) for column in columns] for row in found)


def run_runs(
    dirs: list, as_csv: bool = False, provenance: bool = False, everything: bool = False
) -> int:
    """The ``runs`` command: find the runs, then print them as tables (one per score metric
    and direction) or as one CSV."""
    groups = by_score(read_runs(dirs))
    if as_csv:
        _print_csv(rows([run for group in groups for run in group.runs], provenance=provenance))
        return 0
    width = shutil.get_terminal_size().columns
    for index, group in enumerate(groups):
        columns = _provenance_columns(group.runs, provenance)
        extra = {c: [escaped(provenance_of(run, c) or "-") for run in group.runs] for c in columns}
        if index:
            print()
        print(escaped(group.title))
        for line in table_lines(group, extra, everything, width):
            print(line)
    return 0
