"""A sweep's own cost, and what parallel workers buy on the cores there are.

    python -m bench.sweep [--reps 3] [--trials 6] [--epochs 20]

1. Overhead: N short trials (20 epochs of 20480 samples of the bench task, about 10 s each)
   through ``gatle-ignite sweep`` (one worker, a grid over the learning rate) against the same
   N runs started one after another by hand with ``gatle-ignite train`` and the same
   overrides; one torch thread each (target <= 1.10x).
2. Throughput: the same N trials with ``--workers 2`` against one worker, with no thread
   setting of the user's, so each worker gets its share of the cores (target >= 1.6x on 2
   cores); and, for comparison, 2 workers each given every core, as `train --config=a,b`
   children were before the budget.

Wall time of whole commands from the repository root, variants interleaved.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

LRS = (1e-3, 2e-3, 3e-3, 5e-3, 7e-3, 1e-2, 2e-2, 3e-2)
# Ten times the bench task's training samples per epoch: a trial trains for about as long as its
# process takes to start, which is still a short trial.
SAMPLES = 20480
LIMITS = {"overhead": 1.10, "workers": 1.6}


def _lrs(trials):
    return LRS[:trials]


def _task(epochs):
    return [f"max_epochs={epochs}", f"train_ds_params.n={SAMPLES}"]


def _timed(command, env):
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=common.ROOT, env=env, capture_output=True, text=True, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])}... failed:\n{done.stdout[-3000:]}")
    return time.perf_counter() - started


def _sweep(tmp, trials, epochs, workers, env):
    sweep_dir = Path(tmp) / f"sweep_{time.monotonic_ns()}"
    grid = "[" + ", ".join(repr(lr) for lr in _lrs(trials)) + "]"
    command = [sys.executable, "-m", "gatle_ignite", "sweep", f"--config={common.CONFIG}"]
    command += ["--dir", str(sweep_dir), f"--trials={trials}", f"--workers={workers}"]
    command += ["--sampler=grid", "--pruner=none", f"--param=optimizer_params.lr={grid}"]
    command += [f"--override={item}" for item in _task(epochs)]
    try:
        return _timed(command, env)
    finally:
        shutil.rmtree(sweep_dir, ignore_errors=True)


def _by_hand(tmp, trials, epochs, env):
    """The same trials as a person would run them: one ``train`` after another."""
    root = Path(tmp) / f"hand_{time.monotonic_ns()}"
    started = time.perf_counter()
    for number, lr in enumerate(_lrs(trials)):
        command = [sys.executable, "-m", "gatle_ignite", "train", f"--config={common.CONFIG}"]
        overrides = [*_task(epochs), f"save_dir={root}/trial_{number:04d}"]
        overrides += [f"name=hand-trial_{number:04d}", f"optimizer_params.lr={lr!r}"]
        _timed(command + [f"--override={o}" for o in overrides], env)
    shutil.rmtree(root, ignore_errors=True)
    return time.perf_counter() - started


def _env(threads=None, cpus=None):
    env = common.child_env()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if cpus is not None:
        env["GATLE_IGNITE_CPUS"] = str(cpus)
    return env


def measure(reps, trials, epochs):
    cores = len(os.sched_getaffinity(0))
    one_thread = _env(threads=1)
    variants = {
        "by_hand": lambda tmp: _by_hand(tmp, trials, epochs, one_thread),
        "sweep": lambda tmp: _sweep(tmp, trials, epochs, 1, one_thread),
        "one_worker": lambda tmp: _sweep(tmp, trials, epochs, 1, _env()),
        "two_workers": lambda tmp: _sweep(tmp, trials, epochs, 2, _env()),
        # A share of twice the cores: each of the 2 workers is told every core is its own.
        "two_unbudgeted": lambda tmp: _sweep(tmp, trials, epochs, 2, _env(cpus=2 * cores)),
    }
    with tempfile.TemporaryDirectory(prefix="gatle-bench-sweep-") as tmp:
        return common.interleaved(None, list(variants), reps, run=lambda name: variants[name](tmp))


LABELS = {
    "by_hand": "N x `train` by hand, 1 thread",
    "sweep": "`sweep`, 1 worker, 1 thread",
    "one_worker": "`sweep`, 1 worker, its share (all cores)",
    "two_workers": "`sweep --workers 2`, each its share",
    "two_unbudgeted": "`sweep --workers 2`, each every core",
}


def run(reps=None, trials=6, epochs=20):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print(f"== sweep: {trials} trials of {epochs} epochs of {SAMPLES} samples ==")
    times = measure(reps or 3, trials, epochs)
    rows = []
    for name, values in times.items():
        seconds = common.median(values)
        rows.append([LABELS[name], f"{seconds:.1f}", f"{trials / seconds * 60:.1f}"])
        rows[-1].append(f"{common.spread(values):.0f}%")
    text = common.table(["variant", "wall s", "trials/min", "±"], rows)
    extra = common.median([s - h for s, h in zip(times["sweep"], times["by_hand"])])
    overhead = common.paired_ratio(times["sweep"], times["by_hand"])
    speedup = common.paired_ratio(times["one_worker"], times["two_workers"])
    unbudgeted = common.paired_ratio(times["one_worker"], times["two_unbudgeted"])
    text += (
        f"\n\nsweep / by hand: {overhead:.3f}x ({extra:+.1f} s for {trials} trials); "
        f"throughput of 2 workers / 1: {speedup:.2f}x (each every core: {unbudgeted:.2f}x)"
    )
    print(text)
    checks = [
        common.Check("sweep: N trials against N `train` by hand", overhead, LIMITS["overhead"]),
        common.Check(
            "sweep: 2 workers' time / 1 worker's (throughput >= 1.6x)",
            1 / speedup,
            1 / LIMITS["workers"],
            note=f"throughput {speedup:.2f}x on {len(os.sched_getaffinity(0))} cores",
        ),
    ]
    return text, checks


if __name__ == "__main__":
    common.main(
        __doc__,
        run,
        options=(
            ("--trials", {"type": int, "default": 6, "help": "trials per sweep (at most 8)"}),
            ("--epochs", {"type": int, "default": 20, "help": "epochs per trial"}),
        ),
    )
