"""Start-up: CLI commands and time to the first training iteration, against ``import torch``.

    python -m bench.startup [--reps 5]

Every command is a fresh process, timed from just before it is started; the commands run
interleaved. ``train`` is timed to the first ``ITERATION_STARTED`` of the bench config's run
(its defaults, one iteration), which the bench trainer stamps with the wall clock. That the
quick commands import neither torch nor ignite is tests/test_cli.py's to check.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

LIMITS = {"version": 0.5, "init": 0.5, "train_first_iteration": 1.5}
LABELS = {
    "import_torch": 'python -c "import torch"',
    "import_torch_ignite": 'python -c "import torch, ignite.engine"',
    "version": "gatle-ignite --version",
    "init": "gatle-ignite init NAME",
    "config": "gatle-ignite config --config=...",
    "train_first_iteration": "gatle-ignite train: to first iteration",
    "train_total": "gatle-ignite train: 1 iteration, whole run",
}


def _cli():
    """The installed console script, as a user runs it; ``python -m`` when it is missing."""
    script = Path(sys.executable).with_name("gatle-ignite")
    found = str(script) if script.exists() else shutil.which("gatle-ignite")
    return [found] if found else [sys.executable, "-m", "gatle_ignite"]


def _process(command, env=None):
    """Run one command from the repo root; ``(wall seconds, wall clock at start)``."""
    environment = common.child_env()
    environment.update(env or {})
    started, start = time.time(), time.perf_counter()
    proc = subprocess.run(
        command, cwd=common.ROOT, env=environment, capture_output=True, text=True, timeout=300
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return elapsed, started


def _train(tmp, rep):
    """Seconds from starting ``gatle-ignite train`` to its first iteration, and in total."""
    record = Path(tmp) / f"record_{rep}.json"
    overrides = [f"save_dir={tmp}/run_{rep}", "max_epochs=1", "train_length=1"]
    command = [*_cli(), "train", f"--config={common.CONFIG}"]
    env = {common.RECORD_ENV: str(record), common.FIRST_ITERATION_ENV: "1"}
    total, started = _process(command + [f"--override={o}" for o in overrides], env)
    return json.loads(record.read_text())["first_iteration"] - started, total


def measure(reps):
    cli = _cli()
    commands = {
        "import_torch": [sys.executable, "-c", "import torch"],
        "import_torch_ignite": [sys.executable, "-c", "import torch, ignite.engine"],
        "version": [*cli, "--version"],
        "config": [*cli, "config", f"--config={common.CONFIG}"],
    }
    times = {name: [] for name in LABELS}
    with tempfile.TemporaryDirectory(prefix="gatle-bench-startup-") as tmp:
        for rep in range(reps):
            for name, command in commands.items():
                times[name].append(_process(command)[0])
            times["init"].append(_process([*cli, "init", "proj", f"--dir={tmp}/init_{rep}"])[0])
            first, total = _train(tmp, rep)
            times["train_first_iteration"].append(first)
            times["train_total"].append(total)
    return times


def run(reps=None):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== start-up ==")
    times = measure(reps or 5)
    base = common.median(times["import_torch"])
    rows = []
    for name, values in times.items():
        value = common.median(values)
        rows.append([LABELS[name], f"{value:.3f}", f"{value - base:+.3f}", f"{value / base:.2f}x"])
        rows[-1].append(f"{common.spread(values):.0f}%")
    headers = ["command", "wall s", "vs import torch", "ratio", "±"]
    text = common.table(headers, rows)
    print(text)
    measured = {name: common.median(times[name]) for name in ("version", "init")}
    measured["train_first_iteration"] = common.median(times["train_first_iteration"]) - base
    checks = [
        common.Check(f"start-up: {LABELS[name]}", value, LIMITS[name], unit=" s")
        for name, value in measured.items()
    ]
    checks[-1].note = f"beyond import torch ({base:.3f} s)"
    return text, checks


if __name__ == "__main__":
    common.main(__doc__, run)
