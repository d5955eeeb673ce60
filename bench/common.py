"""What every benchmark shares: the task, child processes, clocks, statistics and tables."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
# The synthetic example as every benchmark runs it (see bench/tasks/synthetic_bench.py).
CONFIG = "bench/tasks/synthetic_bench.py"
EXTRAS_OFF = ("logger_name=[]", "every_val=0", "save_ckpt=False", "score_name=None")
# Where a bench Trainer writes what it measured; set by the process that starts the run.
RECORD_ENV = "GATLE_BENCH_RECORD"
# Set, the bench Trainer also stamps its first iteration with the wall clock.
FIRST_ITERATION_ENV = "GATLE_BENCH_FIRST_ITERATION"
# "reads" or "syncs": the bench Trainer counts the loop's host reads (bench/reads.py).
COUNT_ENV = "GATLE_BENCH_COUNT"
# Set, the bench Trainer also times its epoch boundaries and its end in CPU (bench/checkpoint.py).
BOUNDARY_ENV = "GATLE_BENCH_BOUNDARY"
# An older checkout's src/: its variants run beside the current ones as "<variant>@<commit>".
BASELINE_ENV = "GATLE_BENCH_BASELINE"

SEED = 42
EPOCHS = 20
WARMUP_EPOCHS = 1
TRAIN_N = 2048
BATCH = 64
ITERS_PER_EPOCH = TRAIN_N // BATCH
LR = 1e-3
WEIGHT_DECAY = 0.01


def clock():
    """``(wall, cpu)`` seconds; CPU time is what other users of the cores cannot inflate."""
    return time.perf_counter(), time.process_time()


def per_iteration(stamps, iterations, warmup=WARMUP_EPOCHS):
    """``(wall, cpu)`` seconds per iteration of the fastest epoch after the warm-up, each clock
    on its own: on a shared machine other processes only ever add time, to some epochs."""
    epochs = list(zip(stamps[warmup - 1 :], stamps[warmup:]))
    return tuple(min(end[i] - start[i] for start, end in epochs) / iterations for i in (0, 1))


def synthetic_tensors(split="train", n=None):
    """The synthetic example's own tensors, so every variant reads the same samples."""
    from examples.synthetic.dataloaders.synthetic_dataset import get_ds
    from gatle_ignite.config.loader import load_config_from_file

    cfg = load_config_from_file(ROOT / CONFIG)
    params = dict(cfg.train_ds_params if split == "train" else cfg.valid_ds_params)
    params["n"] = n or params["n"]
    return get_ds(params)[0].dataset.tensors


def loader(tensors, train=True):
    """The example's loader: shuffled with the last batch dropped for training, else in order."""
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(*tensors), batch_size=BATCH, shuffle=train, drop_last=train)


def mlp(in_dim=64, hidden=128, n_classes=10):
    """The example's MLP written by hand: same layers, so the same seed gives the same weights."""
    from torch import nn

    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


def adamw(model):
    """AdamW with gatle_ignite.optimizers.adamw's groups: no decay on biases and 1-d params."""
    import torch

    groups = [{"params": [], "weight_decay": WEIGHT_DECAY}, {"params": [], "weight_decay": 0.0}]
    for name, param in model.named_parameters():
        groups[param.ndim <= 1 or name.endswith(".bias")]["params"].append(param)
    return torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY)


def seeded_task():
    """Seed, then data, then the model: the order in which gatle-ignite draws from the seed."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    tensors = synthetic_tensors()
    model = mlp()
    return tensors, loader(tensors), model, adamw(model)


def bare_step(model, optimizer, x, y):
    """The bare loop's training step."""
    import torch.nn.functional as F

    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def final_loss(logits_of, tensors):
    """Cross-entropy of the trained model over all training samples, outside any timing."""
    import torch
    import torch.nn.functional as F

    x, y = tensors
    with torch.no_grad():
        return float(F.cross_entropy(logits_of(x), y))


def write_record(record):
    path = os.environ.get(RECORD_ENV)
    if path:
        Path(path).write_text(json.dumps(record))


def run_gatle(overrides, config=CONFIG):
    """``gatle-ignite train`` in this process, as a user runs it; returns the trainer's record."""
    import torch

    from gatle_ignite.cli.main import main

    torch.set_num_threads(1)
    # A fresh save_dir each time: a run directory is never trained into twice.
    with tempfile.TemporaryDirectory(prefix="gatle-bench-") as tmp:
        record = Path(tmp) / "record.json"
        os.environ[RECORD_ENV] = str(record)
        items = [f"save_dir={tmp}/run", *overrides]
        code = main(["train", f"--config={config}"] + [f"--override={item}" for item in items])
        # Before the temporary directory is removed: that is the benchmark's, not the run's.
        returned_cpu = time.process_time()
        if code != 0:
            raise SystemExit(code)
        return {**json.loads(record.read_text()), "returned_cpu": returned_cpu}


def git(*args, cwd=ROOT):
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    return proc.stdout.rstrip() if proc.returncode == 0 else ""


def baseline_commit():
    """The short commit of the baseline checkout (``GATLE_BENCH_BASELINE``), or None."""
    src = os.environ.get(BASELINE_ENV)
    return (git("rev-parse", "--short", "HEAD", cwd=src) or Path(src).name) if src else None


def with_baseline(names, compared):
    """``names``, plus ``<name>@<commit>`` of each compared variant when a baseline is set."""
    commit = baseline_commit()
    return list(names) + ([f"{name}@{commit}" for name in compared] if commit else [])


def label(labels, variant):
    name, _, commit = variant.partition("@")
    return labels[name] + (f", at {commit}" if commit else "")


def child_env(variant=""):
    """One thread per process, so variants compare like for like on a shared machine; a
    baseline variant imports gatle_ignite from the baseline checkout."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    for name in (RECORD_ENV, FIRST_ITERATION_ENV, COUNT_ENV, BOUNDARY_ENV):
        env.pop(name, None)
    if "@" in variant:
        env["PYTHONPATH"] = os.pathsep.join([os.environ[BASELINE_ENV], str(ROOT)])
    return env


def run_child(module, variant, args=(), timeout=900):
    """``python -m <module> --child <variant> <args>`` from the repo root; the JSON it wrote."""
    with tempfile.TemporaryDirectory(prefix="gatle-bench-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", module, "--child", variant, *args, "--out", str(out)]
        proc = subprocess.run(
            command, cwd=ROOT, env=child_env(variant), capture_output=True, timeout=timeout
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr).decode(errors="replace")[-4000:]
            raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def interleaved(module, variants, reps, args=(), run=None):
    """``{variant: [result per repetition]}``, each from a fresh process.

    Rotated each repetition, so no variant always runs first or right after the same one.
    """
    run = run or (lambda name: run_child(module, name, args))
    results = {name: [] for name in variants}
    for rep in range(reps):
        shift = rep % len(variants)
        for name in variants[shift:] + variants[:shift]:
            results[name].append(run(name))
            print(f"  rep {rep + 1}/{reps} {name}", flush=True)
    return results


def median(values):
    return statistics.median(values)


def spread(values):
    """Half the range, as a percentage of the median: how much the repetitions disagree."""
    mid = statistics.median(values)
    return 50.0 * (max(values) - min(values)) / mid if mid else 0.0


def paired_ratio(values, base):
    """The median over repetitions of each value against the base of the same repetition."""
    return median([v / b for v, b in zip(values, base)])


def ratio_table(times, base, labels, unit):
    """A table of time per ``unit`` and ratio to ``base``, and ``{variant: (wall, cpu) ratio}``.

    ``times`` is ``{variant: [(wall, cpu) seconds per repetition]}``.
    """
    rows, ratios = [], {}
    for name, values in times.items():
        ratios[name] = tuple(
            paired_ratio([v[i] for v in values], [b[i] for b in times[base]]) for i in (0, 1)
        )
        cpu = [v[1] for v in values]
        medians = [ms(median([v[i] for v in values])) for i in (0, 1)]
        rows.append([label(labels, name), *medians, *(f"{r:.3f}x" for r in ratios[name])])
        rows[-1].append(f"{spread(cpu):.0f}%")
    headers = ["variant", f"wall ms/{unit}", f"cpu ms/{unit}", "wall ratio", "cpu ratio", "±"]
    return table(headers, rows), ratios


@dataclass
class Check:
    """One target of the issue: a measured ratio (or value) against its limit."""

    name: str
    measured: float
    limit: Optional[float]
    unit: str = "x"
    note: str = ""
    # "SKIP" or "ERROR" when nothing was measured; the note says why.
    unmeasured: str = ""

    @property
    def status(self):
        if self.unmeasured or self.limit is None:
            return self.unmeasured or "info"
        return "PASS" if self.measured <= self.limit else "FAIL"

    def row(self):
        limit = "-" if self.limit is None else f"<= {self.limit:g}{self.unit}"
        measured = "-" if self.unmeasured else f"{self.measured:.3f}{self.unit}"
        return [self.name, measured, limit, self.status, self.note]


def unmeasured(name, status, reason):
    return Check(name, float("nan"), None, note=reason, unmeasured=status)


def table(headers, rows):
    """A GitHub-flavoured markdown table, which also reads well in a terminal."""
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def checks_table(checks):
    return table(["check", "measured", "target", "status", "note"], [c.row() for c in checks])


def ms(seconds):
    return f"{seconds * 1e3:.3f}"


def main(doc, run, child=None, options=()):
    """The command line every benchmark shares: ``--reps``, its own ``options`` (flag, argparse
    keywords), and the internal ``--child NAME --out PATH`` that runs one variant."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--reps", type=int, help="repetitions (default: the benchmark's own)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    for flag, keywords in options:
        parser.add_argument(flag, **keywords)
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(child(args.child, args)))
        return
    options = {k: v for k, v in vars(args).items() if k not in ("reps", "child", "out")}
    _, checks = run(args.reps, **options)
    if checks:
        print(checks_table(checks))
