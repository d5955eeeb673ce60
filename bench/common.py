"""What every benchmark shares: the task, child processes, clocks, statistics and tables."""

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
# Where a bench Trainer writes what it measured; set by the process that starts the run.
RECORD_ENV = "GATLE_BENCH_RECORD"
# Set, the bench Trainer also stamps its first iteration with the wall clock.
FIRST_ITERATION_ENV = "GATLE_BENCH_FIRST_ITERATION"

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
    """``(wall, cpu)`` seconds per iteration between the end of the warm-up and the last stamp."""
    start, end = stamps[warmup - 1], stamps[-1]
    count = (len(stamps) - warmup) * iterations
    return (end[0] - start[0]) / count, (end[1] - start[1]) / count


def synthetic_tensors(split="train", n=None):
    """The synthetic example's own tensors, so every variant reads the same samples."""
    from examples.synthetic.dataloaders.synthetic_dataset import get_ds
    from gatle_ignite.config.loader import load_config_from_file

    cfg = load_config_from_file(ROOT / CONFIG)
    params = dict(cfg.train_ds_params if split == "train" else cfg.valid_ds_params)
    if n is not None:
        params["n"] = n
    loader, _ = get_ds(params)
    return loader.dataset.tensors


def train_loader(tensors):
    """The loader the example's config asks for: batch 64, shuffled, last batch dropped."""
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(*tensors), batch_size=BATCH, shuffle=True, drop_last=True)


def eval_loader(tensors):
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(*tensors), batch_size=BATCH, shuffle=False)


def mlp(in_dim=64, hidden=128, n_classes=10):
    """The example's MLP written by hand: same layers, so the same seed gives the same weights."""
    from torch import nn

    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


def adamw(model):
    """AdamW with gatle_ignite.optimizers.adamw's groups: no decay on biases and 1-d params."""
    import torch

    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim <= 1 or name.endswith(".bias") else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": WEIGHT_DECAY},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY)


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


def child_env(extra=None):
    """One thread per process, so variants compare like for like on a shared machine."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.pop(RECORD_ENV, None)
    env.pop(FIRST_ITERATION_ENV, None)
    env.update(extra or {})
    return env


def run_child(module, args, timeout=900, env=None):
    """Run ``python -m <module> <args>`` from the repo root; returns the JSON it wrote."""
    with tempfile.TemporaryDirectory(prefix="gatle-bench-") as tmp:
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "log.txt"
        command = [sys.executable, "-m", module, *args, "--out", str(out)]
        with open(log, "w") as handle:
            proc = subprocess.run(
                command,
                cwd=ROOT,
                env=child_env(env),
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        if proc.returncode != 0 or not out.exists():
            tail = log.read_text()[-4000:]
            raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def run_each(module, names, args=()):
    """``[(name, result)]``, each from a fresh ``python -m <module> --child <name> <args>``."""
    return [(name, run_child(module, ["--child", name, *args])) for name in names]


def median(values):
    return statistics.median(values)


def spread(values):
    """Half the range, as a percentage of the median: how much the repetitions disagree."""
    mid = statistics.median(values)
    return 50.0 * (max(values) - min(values)) / mid if mid else 0.0


@dataclass
class Check:
    """One target of the issue: a measured ratio (or value) against its limit."""

    name: str
    measured: float
    limit: Optional[float]
    unit: str = "x"
    note: str = ""
    skip: bool = False
    error: str = ""

    @property
    def status(self):
        if self.error:
            return "ERROR"
        if self.skip:
            return "SKIP"
        if self.limit is None:
            return "info"
        return "PASS" if self.measured <= self.limit else "FAIL"

    def row(self):
        limit = "-" if self.limit is None else f"<= {self.limit:g}{self.unit}"
        measured = "-" if self.skip or self.error else f"{self.measured:.3f}{self.unit}"
        return [self.name, measured, limit, self.status, self.error or self.note]


def skipped(name, reason):
    return Check(name, float("nan"), None, note=reason, skip=True)


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


def out_arg(parser):
    parser.add_argument("--out", help="write the child's result here as JSON (internal)")
    parser.add_argument("--child", help="run one variant in this process (internal)")
    return parser
