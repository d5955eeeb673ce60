"""Start-up: CLI commands and time to the first training iteration, against ``import torch``.

    python -m bench.startup [--reps 5]

Every command is a fresh process, timed from just before it is started; the commands run
interleaved. ``train`` is timed to the first ``ITERATION_STARTED`` of the bench config's run
(its defaults, one iteration), which the bench trainer stamps with the wall clock.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

VERSION_LIMIT = 0.5
INIT_LIMIT = 0.5
FIRST_ITERATION_LIMIT = 1.5
# Which heavy packages a command imported: a fast command must import neither.
_IMPORT_PROBE = """
import sys
from gatle_ignite.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("IMPORTED", sorted(m for m in ("torch", "ignite") if m in sys.modules), file=sys.stderr)
"""


def _cli():
    """The installed console script, as a user runs it; ``python -m`` when it is missing."""
    script = Path(sys.executable).with_name("gatle-ignite")
    if script.exists():
        return [str(script)]
    found = shutil.which("gatle-ignite")
    return [found] if found else [sys.executable, "-m", "gatle_ignite"]


def _timed(command, env=None):
    """Wall seconds of one process; ``(seconds, wall clock at start)``."""
    started = time.time()
    start = time.perf_counter()
    proc = subprocess.run(
        command,
        cwd=common.ROOT,
        env=common.child_env(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return elapsed, started


def _imports(args):
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, *args],
        cwd=common.ROOT,
        env=common.child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("IMPORTED")]
    return line[-1].split(" ", 1)[1] if line else "?"


def _first_iteration(tmp, rep):
    """Seconds from starting ``gatle-ignite train`` to its first iteration, and in total."""
    record = Path(tmp) / f"record_{rep}.json"
    command = [
        *_cli(),
        "train",
        f"--config={common.CONFIG}",
        f"--override=save_dir={tmp}/run_{rep}",
        "--override=max_epochs=1",
        "--override=train_length=1",
    ]
    env = {common.RECORD_ENV: str(record), common.FIRST_ITERATION_ENV: "1"}
    total, started = _timed(command, env=env)
    first = json.loads(record.read_text())["first_iteration"]
    return first - started, total


def measure(reps):
    cli = _cli()
    commands = {
        "import_torch": [sys.executable, "-c", "import torch"],
        "import_torch_ignite": [sys.executable, "-c", "import torch, ignite.engine"],
        "version": [*cli, "--version"],
        "config": [*cli, "config", f"--config={common.CONFIG}"],
    }
    times = {name: [] for name in [*commands, "init", "train_first_iteration", "train_total"]}
    with tempfile.TemporaryDirectory(prefix="gatle-bench-startup-") as tmp:
        for rep in range(reps):
            for name, command in commands.items():
                times[name].append(_timed(command)[0])
            times["init"].append(_timed([*cli, "init", "benchproj", f"--dir={tmp}/init_{rep}"])[0])
            first, total = _first_iteration(tmp, rep)
            times["train_first_iteration"].append(first)
            times["train_total"].append(total)
    return times


LABELS = {
    "import_torch": 'python -c "import torch"',
    "import_torch_ignite": 'python -c "import torch, ignite.engine"',
    "version": "gatle-ignite --version",
    "init": "gatle-ignite init NAME",
    "config": "gatle-ignite config --config=...",
    "train_first_iteration": "gatle-ignite train: to first iteration",
    "train_total": "gatle-ignite train: 1 iteration, whole run",
}
PROBES = {"version": ["--version"], "config": ["config", f"--config={common.CONFIG}"]}


def run(reps=5):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== start-up ==")
    times = measure(reps)
    imports = {name: _imports(args) for name, args in PROBES.items()}
    with tempfile.TemporaryDirectory() as tmp:
        imports["init"] = _imports(["init", "probe", f"--dir={tmp}"])
    base = common.median(times["import_torch"])
    rows = []
    for name, values in times.items():
        value = common.median(values)
        rows.append(
            [
                LABELS[name],
                f"{value:.3f}",
                f"{value - base:+.3f}",
                f"{value / base:.2f}x",
                f"{common.spread(values):.0f}%",
                imports.get(name, ""),
            ]
        )
    headers = ["command", "wall s", "vs import torch", "ratio", "±", "imports"]
    text = common.table(headers, rows)
    print(text)
    extra = common.median(times["train_first_iteration"]) - base
    checks = [
        common.Check(
            "start-up: gatle-ignite --version",
            common.median(times["version"]),
            VERSION_LIMIT,
            unit=" s",
            note=f"imports {imports['version']}",
        ),
        common.Check(
            "start-up: gatle-ignite init",
            common.median(times["init"]),
            INIT_LIMIT,
            unit=" s",
            note=f"imports {imports['init']}",
        ),
        common.Check(
            "start-up: train to first iteration, beyond import torch",
            extra,
            FIRST_ITERATION_LIMIT,
            unit=" s",
            note=f"import torch alone {base:.3f} s",
        ),
    ]
    return text, checks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    _, checks = run(args.reps)
    print(common.checks_table(checks))


if __name__ == "__main__":
    main()
