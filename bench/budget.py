"""Several configs trained at once: each on its share of the cores, against each on every core.

    python -m bench.budget [--reps 3] [--configs 3] [--epochs 10]

``gatle-ignite train --config=a.py,b.py,c.py`` starts its children together. Each gets
``cores / configs`` torch threads, unless the user set ``OMP_NUM_THREADS``; before, each took
every core, and three children on 2 cores took 165 s each instead of 8 s. The second variant
brings that back by telling each child the machine is ``configs`` times its size
(``GATLE_IGNITE_CPUS``). Wall time of the whole command, variants interleaved.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

# Ten times the bench task's samples per epoch, so that training, not start-up, takes the time.
SAMPLES = 20480


def _configs(tmp, count, epochs, rep):
    paths = []
    for index in range(count):
        path = Path(tmp) / f"budget_{rep}_{index}.py"
        path.write_text(
            "from bench.tasks.synthetic_bench import get_config as bench_config\n\n\n"
            "def get_config():\n"
            "    cfg = bench_config()\n"
            f"    cfg.save_dir = {str(Path(tmp) / f'run_{rep}_{index}_{time.monotonic_ns()}')!r}\n"
            f"    cfg.max_epochs = {epochs}\n"
            f"    cfg.train_ds_params.n = {SAMPLES}\n"
            "    return cfg\n"
        )
        paths.append(str(path))
    return paths


def _train_at_once(tmp, count, epochs, rep, every_core):
    env = common.child_env()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    if every_core:
        env["GATLE_IGNITE_CPUS"] = str(count * len(os.sched_getaffinity(0)))
    command = [sys.executable, "-m", "gatle_ignite", "train"]
    command.append("--config=" + ",".join(_configs(tmp, count, epochs, rep)))
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=common.ROOT, env=env, capture_output=True, text=True, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"train --config=... failed:\n{done.stdout[-3000:]}")
    return time.perf_counter() - started


LABELS = {"share": "each its share of the cores", "every_core": "each every core (as before)"}


def run(reps=None, configs=3, epochs=10):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    cores = len(os.sched_getaffinity(0))
    print(f"== budget: train --config= {configs} configs at once, {cores} cores ==")
    counter = iter(range(10**6))
    with tempfile.TemporaryDirectory(prefix="gatle-bench-budget-") as tmp:
        times = common.interleaved(
            None,
            list(LABELS),
            reps or 3,
            run=lambda name: _train_at_once(
                tmp, configs, epochs, next(counter), every_core=name == "every_core"
            ),
        )
    rows = [
        [LABELS[name], f"{common.median(v):.1f}", f"{common.spread(v):.0f}%"]
        for name, v in times.items()
    ]
    ratio = common.paired_ratio(times["every_core"], times["share"])
    text = common.table(["children", "wall s", "±"], rows)
    text += f"\n\nevery core / share: {ratio:.2f}x"
    print(text)
    return text, [common.Check("budget: 3 configs at once, every core vs share", ratio, None)]


if __name__ == "__main__":
    common.main(
        __doc__,
        run,
        options=(
            ("--configs", {"type": int, "default": 3, "help": "configs trained at once"}),
            ("--epochs", {"type": int, "default": 10, "help": "epochs per config"}),
        ),
    )
