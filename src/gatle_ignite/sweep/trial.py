"""A trial as a run: its directory, its overrides, its command line, and how it ended.

A trial is the config plus the sweep's overrides, its own ``save_dir`` and ``name``, and its
parameters as overrides: nothing else, so ``gatle-ignite train`` with those overrides, typed by
hand, trains the same run.
"""

import ast
import csv
import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from gatle_ignite.callbacks.backends.csv import FILE_NAME as HISTORY_FILE
from gatle_ignite.redaction import redact_argv
from gatle_ignite.run.outside import manifest_of, record_failed
from gatle_ignite.run.storage import is_url
from gatle_ignite.trainer.lifecycle import EXIT_DIVERGED
from gatle_ignite.trainer.preemption import EXIT_PREEMPTED, signal_name

__all__ = [
    "TRIAL_PREFIX",
    "Outcome",
    "logged_scores",
    "outcome_of",
    "param_override",
    "record_failure",
    "shown_command",
    "train_argv",
    "trial_dir",
    "trial_name",
    "trial_overrides",
]

TRIAL_PREFIX = "trial_"
_FINISHED = {"completed": "complete", "early-stopped": "complete", "pruned": "pruned"}


def trial_name(number: int) -> str:
    return f"{TRIAL_PREFIX}{number:04d}"


def trial_dir(sweep_dir, number: int):
    """A trial's save_dir: a Path, or below a URL sweep directory a URL."""
    if is_url(sweep_dir):
        return f"{sweep_dir.rstrip('/')}/{trial_name(number)}"
    return Path(sweep_dir) / trial_name(number)


def param_override(key: str, value) -> str:
    """``key=value`` as ``--override`` reads it back: a string bare when it reads back as
    itself (a path, a name), else the value's literal."""
    if isinstance(value, str) and _reads_back_as_itself(value):
        return f"{key}={value}"
    return f"{key}={value!r}"


def _reads_back_as_itself(text: str) -> bool:
    # The rule --override applies: a Python literal when it is one, else the text itself.
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text == text.strip() and text != ""
    return False


def trial_overrides(sweep, study: str, number: int, params: dict) -> list:
    """Every override that makes the config trial ``number`` (``resume`` aside)."""
    own = [
        param_override("save_dir", str(trial_dir(sweep.dir, number))),
        param_override("name", f"{study}-{trial_name(number)}"),
    ]
    return [*sweep.overrides, *own, *(param_override(k, v) for k, v in params.items())]


def train_argv(config: str, overrides: list, resume: bool) -> list:
    """The trial's process: ``python -m gatle_ignite train`` with its overrides."""
    extra = ["--override=resume=True"] if resume else []
    words = [f"--config={config}", *(f"--override={item}" for item in overrides), *extra]
    return [sys.executable, "-m", "gatle_ignite", "train", *words]


def shown_command(verb: str, config: str, overrides: list, *extra: str) -> str:
    """A ``gatle-ignite`` command line a person can paste, each key overridden once (its last
    value, which is the one that counts), in the run summary's ``--override KEY=VALUE`` style;
    secrets redacted."""
    words = ["gatle-ignite", verb, f"--config={config}"]
    for item in _last_of_each_key(overrides):
        words += ["--override", item]
    return " ".join(_shell_word(word) for word in redact_argv([*words, *extra]))


def _last_of_each_key(overrides: list) -> list:
    keys = [item.partition("=")[0] for item in overrides]
    return [item for i, (item, key) in enumerate(zip(overrides, keys)) if key not in keys[i + 1 :]]


def _shell_word(word: str) -> str:
    quoted = shlex.quote(word)
    if quoted == word or any(c in word for c in '"$`\\!'):
        return quoted
    return f'"{word}"'  # reads better than shlex's quoting of a quote


@dataclass(frozen=True)
class Outcome:
    """How a trial's process ended: ``complete``, ``pruned``, ``diverged``, ``failed`` or
    ``preempted``."""

    state: str
    reason: str = ""


def outcome_of(exit_code: int, save_dir, output_tail: list) -> Outcome:
    """The trial's outcome, from its process's exit code and its run's ``run.json``."""
    if exit_code == EXIT_PREEMPTED:
        return Outcome("preempted")
    manifest = manifest_of(save_dir)
    state = manifest.state if manifest is not None else None
    if exit_code == 0 and state in _FINISHED:
        return Outcome(_FINISHED[state], manifest.stop_reason)
    if exit_code == EXIT_DIVERGED and state == "diverged":
        return Outcome("diverged", manifest.stop_reason)
    if state == "failed" and manifest.stop_reason:
        return Outcome("failed", f"{state}: {manifest.stop_reason}")
    return Outcome("failed", _reason_from_output(exit_code, output_tail))


def record_failure(save_dir, reason: str) -> None:
    """Record a trial the sweep fails as failed in its ``run.json``, when its process ended
    without saying how (a SIGKILL, the OOM killer): ``status`` then agrees with the study, which
    never resumes a failed trial."""
    record_failed(save_dir, f"{reason}; its sweep recorded the trial failed")


def _reason_from_output(exit_code: int, lines: list) -> str:
    lines = [line.strip() for line in lines if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith("config error:"):
            return " ".join(lines[index : index + 3])
    if exit_code < 0:
        return f"killed by {signal_name(-exit_code)}"
    last = lines[-1] if lines else "no output"
    return f"exit code {exit_code}: {last}"


def logged_scores(save_dir, metric: str) -> dict:
    """``{epoch: value}`` of ``metric`` in the run's ``metrics.csv``: the finite scores it
    evaluated, the last of each epoch (a resume drops the rows it trains again)."""
    scores = {}
    try:
        with open(Path(save_dir) / HISTORY_FILE, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row.get("name") != metric:
                    continue
                try:
                    epoch, value = int(float(row["epoch"])), float(row["value"])
                except (KeyError, TypeError, ValueError):
                    continue
                if math.isfinite(value):
                    scores[epoch] = value
    except (OSError, csv.Error):
        return {}
    return scores
