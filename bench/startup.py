"""Start-up: CLI commands, and the time to the first training step against a bare script's.

    python -m bench.startup [--reps 5]

Every command is a fresh process; the commands run interleaved. Each is measured twice: wall
time from just before it is started, and its CPU time (user + system, from the children's
resource usage), which other work on the cores cannot inflate and so is what the checks use.

- ``train`` runs the bench config (its defaults, one iteration). The bench trainer stamps its
  first ``ITERATION_STARTED`` with the wall clock and the process's CPU time since it started;
  the bare script (``python -m bench.startup --child bare``) does the same at its first step,
  after importing torch and building the same data, model and AdamW by hand.
- ``config`` and ``config --dry-run`` are compared with what they cannot avoid: importing the
  user's own code, i.e. the config file and every module it names (the trainer, the model, the
  data, the loss terms, the metrics, the optimizer and the scheduler), in one bare process.

That the quick commands import neither torch nor ignite is tests/test_cli.py's to check; that no
optional extra is imported by a run that does not use it, tests/test_startup.py's.
"""

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

# Seconds for the quick commands; a ratio for the first step; seconds beyond the user's imports.
LIMITS = {
    "version": 0.5,
    "init": 0.5,
    "train_first_step": 1.1,
    "config": 0.5,
    "dry_run": 0.5,
}
LABELS = {
    "import_torch": 'python -c "import torch"',
    "user_imports": "the user's own imports (config file and every module it names)",
    "version": "gatle-ignite --version",
    "init": "gatle-ignite init NAME",
    "config": "gatle-ignite config --config=...",
    "dry_run": "gatle-ignite config --dry-run --config=...",
    "bare_first_step": "bare script: to its first step",
    "train_first_step": "gatle-ignite train: to its first step",
    "train_total": "gatle-ignite train: 1 iteration, whole run",
}
# Config fields holding the dotted path of a module the user wrote or chose.
_MODULE_FIELDS = ("main_runner", "lr_scheduler", "cls_name")


def _cli():
    """The installed console script, as a user runs it; ``python -m`` when it is missing."""
    script = Path(sys.executable).with_name("gatle-ignite")
    found = str(script) if script.exists() else shutil.which("gatle-ignite")
    return [found] if found else [sys.executable, "-m", "gatle_ignite"]


def _process(command, env=None):
    """Run one command from the repo root; ``(wall s, CPU s, wall clock at start)``."""
    environment = common.child_env()
    environment.update(env or {})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started, start = time.time(), time.perf_counter()
    proc = subprocess.run(
        command, cwd=common.ROOT, env=environment, capture_output=True, text=True, timeout=300
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return elapsed, cpu, started


def _first_step(command, record, env=None):
    """``(wall, CPU)`` seconds from a process's start to its first step, and its totals."""
    env = {common.RECORD_ENV: str(record), common.FIRST_ITERATION_ENV: "1", **(env or {})}
    total, total_cpu, started = _process(command, env)
    stamps = json.loads(record.read_text())
    first = (stamps["first_iteration"] - started, stamps["first_iteration_cpu"])
    return first, (total, total_cpu)


def _user_modules(config):
    """The config file's module and every module the config names, as dotted paths."""
    from gatle_ignite.config.loader import load_config_from_file

    found = set()

    def walk(node):
        for key, value in node.items():
            named = key in _MODULE_FIELDS or key.endswith("_name")
            if named and isinstance(value, str) and "." in value:
                found.add(value)
            elif hasattr(value, "items"):
                walk(value)

    walk(load_config_from_file(common.ROOT / config))
    module = str(Path(config).with_suffix("")).replace("/", ".")
    return [module, *sorted(found)]


def bare_first_step():
    """What a bare script does before its first step: torch, the data, the model, AdamW."""
    import os

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(common.SEED)
    # The synthetic example's data, drawn as its dataset module draws it.
    weights = torch.randn(64, 10, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(common.TRAIN_N, 64, generator=torch.Generator().manual_seed(0))
    data = DataLoader(
        TensorDataset(x, (x @ weights).argmax(dim=1)), batch_size=common.BATCH, shuffle=True
    )
    model = common.mlp()
    optimizer = common.adamw(model)
    for batch_x, batch_y in data:
        record = {"first_iteration": time.time(), "first_iteration_cpu": time.process_time()}
        common.bare_step(model, optimizer, batch_x, batch_y)
        break
    Path(os.environ[common.RECORD_ENV]).write_text(json.dumps(record))


def measure(reps):
    cli = _cli()
    config = f"--config={common.CONFIG}"
    user_imports = "import " + ", ".join(_user_modules(common.CONFIG))
    commands = {
        "import_torch": [sys.executable, "-c", "import torch"],
        "user_imports": [sys.executable, "-c", user_imports],
        "version": [*cli, "--version"],
        "config": [*cli, "config", config],
        "dry_run": [*cli, "config", "--dry-run", config],
    }
    times = {name: [] for name in LABELS}
    with tempfile.TemporaryDirectory(prefix="gatle-bench-startup-") as tmp:
        for rep in range(reps):
            for name, command in commands.items():
                times[name].append(_process(command)[:2])
            init = [*cli, "init", "proj", f"--dir={tmp}/init_{rep}"]
            times["init"].append(_process(init)[:2])
            out = f"{tmp}/bare_{rep}.out"
            bare = [sys.executable, "-m", "bench.startup", "--child", "bare", "--out", out]
            first, _total = _first_step(bare, Path(tmp) / f"bare_{rep}.json")
            times["bare_first_step"].append(first)
            overrides = [f"save_dir={tmp}/run_{rep}", "max_epochs=1", "train_length=1"]
            train = [*cli, "train", config, *(f"--override={o}" for o in overrides)]
            first, total = _first_step(train, Path(tmp) / f"record_{rep}.json")
            times["train_first_step"].append(first)
            times["train_total"].append(total)
            print(f"  rep {rep + 1}/{reps}", flush=True)
    return times


def _median(times, name, index):
    return common.median([t[index] for t in times[name]])


def _paired(times, name, base, index=1):
    return common.paired_ratio([t[index] for t in times[name]], [t[index] for t in times[base]])


def _beyond(times, name, base):
    """The median over repetitions of a command's CPU beyond its base's in the same one."""
    return common.median([t[1] - b[1] for t, b in zip(times[name], times[base])])


def run(reps=None):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== start-up ==")
    times = measure(reps or 5)
    rows = []
    for name, values in times.items():
        wall, cpu = (_median(times, name, i) for i in (0, 1))
        spread = common.spread([v[1] for v in values])
        rows.append([LABELS[name], f"{wall:.3f}", f"{cpu:.3f}", f"{spread:.0f}%"])
    headers = ["command", "wall s", "CPU s", "± CPU"]
    text = common.table(headers, rows)
    print(text)
    checks = [
        common.Check(f"start-up: {LABELS[name]}", _median(times, name, 0), LIMITS[name], " s")
        for name in ("version", "init")
    ]
    first_cpu = _paired(times, "train_first_step", "bare_first_step")
    first_wall = _paired(times, "train_first_step", "bare_first_step", index=0)
    checks.append(
        common.Check(
            "start-up: train to its first step vs a bare script's, CPU",
            first_cpu,
            LIMITS["train_first_step"],
            note=f"wall {first_wall:.3f}x",
        )
    )
    for name in ("config", "dry_run"):
        checks.append(
            common.Check(
                f"start-up: {LABELS[name]}, CPU beyond the user's own imports",
                _beyond(times, name, "user_imports"),
                LIMITS[name],
                unit=" s",
                note=f"the user's imports {_median(times, 'user_imports', 1):.2f} s",
            )
        )
    return text, checks


def child(variant, _args):
    if variant == "bare":
        bare_first_step()
    return {}


if __name__ == "__main__":
    common.main(__doc__, run, child)
