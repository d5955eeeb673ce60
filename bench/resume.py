"""What a resume costs at 25, 50, 75 and 90 % of an epoch, against a fresh run of the rest.

    python -m bench.resume [--reps 3] [--iterations 400] [--cost-ms 2]

The task: the synthetic example with 4 samples per batch, each taking ``--cost-ms`` to load (a
sleep, as a read would), jittered by random numbers drawn in the loader's 2 workers, for one
epoch of ``--iterations`` iterations; no evaluation, logging or cadence checkpoints. For each
position, one run is preempted there (SIGTERM to itself, a ``latest_iter`` checkpoint), then,
each in a fresh process and interleaved over repetitions:

- resume: ``resume=True`` from a copy of that checkpoint, to the end of the epoch;
- replay: the same with the workers' state taken out of the checkpoint, which is what a
  checkpoint from before constant-time resume holds: the resume loads every batch before the
  position again, as 0.4 always did;
- fresh: a new run of only the remaining iterations (``train_length``).

Each is timed inside its process from before the trainer is built to the end of the run, so
Python's start and imports are left out of all three alike. The resumed and replayed runs must
end on the uninterrupted epoch's weights (``torch.equal`` on every tensor).

What the workers' reports cost while training: one process iterates a 2-worker loader of cheap
samples (64 floats, 4 per batch, so the loader's own overhead is all there is) for 2000
batches, as it is and as the framework iterates it (each batch coming back with its worker's
state), alternating, 5 times each; medians of wall and main-process CPU time per batch.
"""

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench import common
from bench.tasks.resume_task import STOP_AT_ENV

POSITIONS = (25, 50, 75, 90)
# The target: a resume at 75 % and the rest of the epoch within 1.5x a fresh run.
LIMIT_AT_75 = 1.5
CONFIG = "bench/tasks/synthetic_bench.py"


def _overrides(args, save_dir, **extra):
    iterations, batch = int(args.iterations), 4
    params = {
        "n": iterations * batch,
        "in_dim": 64,
        "n_classes": 10,
        "seed": 0,
        "bs": batch,
        "shuffle": True,
        "drop_last": True,
        "num_workers": 2,
        "cost_s": float(args.cost_ms) / 1e3,
    }
    fields = {
        "save_dir": str(save_dir),
        "main_runner": "bench.tasks.resume_task",
        "train_ds_name": "bench.tasks.resume_task",
        "train_ds_params": params,
        "max_epochs": 1,
        "every_val": 0,
        "score_name": None,
        "logger_name": [],
        "save_every_iters": 0,
        **extra,
    }
    return fields


def _config(fields):
    from gatle_ignite.config.loader import load_config_from_file

    cfg = load_config_from_file(common.ROOT / CONFIG)
    with cfg.unlocked():
        for key, value in fields.items():
            cfg[key] = value
    return cfg


def _strip_worker_state(save_dir):
    import torch

    (checkpoint,) = Path(save_dir).glob("latest_iter_checkpoint_*.pt")
    state = torch.load(checkpoint, weights_only=True)
    for rank in state["resume_state"]["ranks"]:
        rank.pop("workers", None)
    torch.save(state, checkpoint)


def _report_cost():
    """``{"plain"|"reporting": (wall, cpu) seconds per batch}``, medians over 5 passes each."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gatle_ignite.run.exact_resume import ResumableLoader

    dataset = TensorDataset(torch.randn(8000, 64), torch.randint(0, 10, (8000,)))
    times = {"plain": [], "reporting": []}
    for rep in range(5):
        for kind in ("plain", "reporting") if rep % 2 else ("reporting", "plain"):
            loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)
            wrapped = ResumableLoader(lambda loader=loader: loader)
            # The workers start here, outside the timing, for both.
            batches = iter(wrapped if kind == "reporting" else loader)
            start = common.clock()
            for _ in batches:
                pass
            end = common.clock()
            times[kind].append([(end[i] - start[i]) / len(loader) for i in (0, 1)])
    return {k: [common.median([t[i] for t in v]) for i in (0, 1)] for k, v in times.items()}


def child(variant, args):
    """One run: ``uninterrupted``, ``prepare:K``, ``resume|replay|fresh:K`` or ``reports``."""
    if variant == "reports":
        return _report_cost()
    import warnings

    import torch

    from gatle_ignite.launch.launcher import launch
    from gatle_ignite.trainer.preemption import Preempted

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    kind, _, at = variant.partition(":")
    at = int(at or 0)
    work = Path(args.work)
    iterations = int(args.iterations)
    if kind == "uninterrupted":
        fields = _overrides(args, work / "uninterrupted")
    elif kind == "prepare":
        fields = _overrides(args, work / f"at{at}")
        os.environ[STOP_AT_ENV] = str(at)
    elif kind == "fresh":
        fields = _overrides(args, tempfile.mkdtemp(dir=work), train_length=iterations - at)
    else:
        target = Path(tempfile.mkdtemp(dir=work)) / "run"
        shutil.copytree(work / f"at{at}", target)
        if kind == "replay":
            _strip_worker_state(target)
        fields = _overrides(args, target, resume=True)
    cfg = _config(fields)
    start = time.perf_counter()
    try:
        task = launch(cfg)
    except Preempted:
        return {"seconds": time.perf_counter() - start}
    seconds = time.perf_counter() - start
    weights = {k: v.tolist() for k, v in task.model.state_dict().items()}
    return {"seconds": seconds, "weights": weights}


def run(reps=None, iterations=400, cost_ms=2, work=None):
    """Measure, print the table, return the checks (bench.run_all calls this); ``work`` is
    the children's folder, made here."""
    print("== resume ==")
    reps = reps or 3
    with tempfile.TemporaryDirectory(prefix="gatle-bench-resume-") as work:
        args = ["--work", work, "--iterations", str(iterations), "--cost-ms", str(cost_ms)]
        uninterrupted = common.run_child("bench.resume", "uninterrupted", args)
        rows, checks, exact = [], [], True
        for percent in POSITIONS:
            at = iterations * percent // 100
            common.run_child("bench.resume", f"prepare:{at}", args)
            variants = [f"{kind}:{at}" for kind in ("resume", "replay", "fresh")]
            results = common.interleaved("bench.resume", variants, reps, args)
            seconds = {v.split(":")[0]: [r["seconds"] for r in results[v]] for v in variants}
            for kind in ("resume", "replay"):
                exact &= all(
                    r["weights"] == uninterrupted["weights"] for r in results[f"{kind}:{at}"]
                )
            ratio = common.paired_ratio(seconds["resume"], seconds["fresh"])
            replay = common.paired_ratio(seconds["replay"], seconds["fresh"])
            rows.append(
                [
                    f"{percent} % (iteration {at} of {iterations})",
                    *(f"{common.median(seconds[k]):.2f}" for k in ("resume", "replay", "fresh")),
                    f"{ratio:.2f}x",
                    f"{replay:.2f}x",
                    f"{common.spread(seconds['resume']):.0f}%",
                ]
            )
            limit = LIMIT_AT_75 if percent == 75 else None
            checks.append(common.Check(f"resume: at {percent} % vs a fresh run", ratio, limit))
        reports = common.run_child("bench.resume", "reports", args)
    headers = ["position", "resume s", "replay s", "fresh s", "resume ratio", "replay ratio", "±"]
    text = common.table(headers, rows)
    plain, reporting = reports["plain"], reports["reporting"]
    text += "\n\n" + common.table(
        ["2-worker loader, cheap samples", "wall us/batch", "main cpu us/batch"],
        [
            ["as it is", f"{plain[0] * 1e6:.0f}", f"{plain[1] * 1e6:.0f}"],
            ["with the workers' reports", f"{reporting[0] * 1e6:.0f}", f"{reporting[1] * 1e6:.0f}"],
        ],
    )
    text += (
        f"\n\n2 workers, 4 samples per batch at {cost_ms} ms each; one uninterrupted epoch "
        f"takes {uninterrupted['seconds']:.2f} s. Resumed and replayed runs end on the "
        f"uninterrupted run's weights: {'yes' if exact else 'NO'}."
    )
    print(text)
    differing = 0.0 if exact else 1.0
    checks.append(
        common.Check("resume: runs ending off the uninterrupted weights", differing, 0.0, "")
    )
    return text, checks


if __name__ == "__main__":
    options = [
        ("--iterations", {"type": int, "default": 400, "help": "iterations per epoch"}),
        ("--cost-ms", {"type": float, "default": 2, "dest": "cost_ms", "help": "per sample"}),
        ("--work", {"help": argparse.SUPPRESS}),
    ]
    common.main(__doc__, run, child, options)
