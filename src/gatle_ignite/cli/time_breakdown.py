"""The run summary's lines on where this command's time went, from the epochs' ``perf/`` rows.

Read from ``metrics.csv`` (rows written since the command started), so they are the same
whether the run trained in this process or in ranks it spawned. When the training loop waited
for data more than a third of its time, one more line says what to change.
"""

import csv
import os
from pathlib import Path
from typing import Optional

from gatle_ignite.callbacks.backends.csv import FILE_NAME
from gatle_ignite.callbacks.perf_line import PERF_PREFIX, duration, rate
from gatle_ignite.trainer.telemetry.threads import usable_cores

__all__ = [
    "DATA_WAIT_ADVICE_SHARE",
    "data_wait_advice",
    "time_breakdown_rows",
    "usable_cores",
]

# Above this share of the training time spent waiting for batches, the summary gives advice.
DATA_WAIT_ADVICE_SHARE = 1 / 3
# Workers suggested per training process, at most: more rarely pays for in-memory datasets.
_MOST_WORKERS = 8


def _perf_rows(save_dir: Path, since: float) -> list:
    """``{name: value}`` per epoch record written at or after ``since`` (wall time)."""
    path = save_dir / FILE_NAME
    if not path.is_file():
        return []
    records = {}
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            name = row.get("name") or ""
            if not name.startswith(PERF_PREFIX):
                continue
            try:
                when, value = float(row["wall_time"]), float(row["value"])
            except (TypeError, ValueError):
                continue
            if when >= since:
                records.setdefault(row.get("step"), {})[name[len(PERF_PREFIX) :]] = value
    return [r for r in records.values() if "train_time_s" in r]


def _weighted(records: list, name: str, weight: str = "train_time_s") -> Optional[float]:
    """The mean of ``name`` over the records, each weighted by its training time."""
    pairs = [(r[name], r[weight]) for r in records if name in r]
    total = sum(w for _v, w in pairs)
    return sum(v * w for v, w in pairs) / total if pairs and total > 0 else None


def data_wait_advice(share: float, cfg) -> str:
    """What to change when the loop waits for data ``share`` of its training time."""
    workers = cfg.get("train_ds_params", {}).get("num_workers", 0) or 0
    processes = cfg.get("nproc_per_node", None) or 1
    cores, machine = usable_cores(), os.cpu_count() or 1
    suggested = max(1, min(_MOST_WORKERS, cores // processes - 1)) * processes
    has = f"{cores} CPU cores" + (f" (of the machine's {machine})" if machine != cores else "")
    waited = f"the training loop waited for its next batch {share:.0%} of its time"
    if workers == 0:
        return (
            f"{waited}: train_ds_params.num_workers is 0, so every batch is loaded in the "
            f"training process, and this process has {has}. Load batches in the background: "
            f"--override train_ds_params.num_workers={suggested}"
        )
    if workers < suggested:
        return (
            f"{waited} with train_ds_params.num_workers = {workers}, and this process has "
            f"{has}. Raise it (--override train_ds_params.num_workers={suggested}), or make a "
            f"sample cheaper to load (decode once and cache, lighter augmentation)."
        )
    return (
        f"{waited} with train_ds_params.num_workers = {workers} on {has}: the workers cannot "
        f"keep up. Make a sample cheaper to load (decode once and cache, lighter augmentation, "
        f"smaller files), or augment on the device in prep_batch."
    )


def time_breakdown_rows(cfg, save_dir: Path, since: float, seconds: float) -> list:
    """``(label, text)`` rows: where the time went, the speed, and advice when due."""
    records = _perf_rows(save_dir, since)
    if not records:
        return []
    train, evaluation, checkpoints = (
        sum(r.get(name, 0.0) for r in records)
        for name in ("train_time_s", "eval_time_s", "checkpoint_stall_s")
    )
    share = _weighted(records, "data_wait_share") or 0.0
    rest = max(seconds - train - evaluation - checkpoints, 0.0)
    rows = [
        (
            "time",
            f"training {duration(train)} (data wait {share:.0%}), evaluation "
            f"{duration(evaluation)}, checkpoints {duration(checkpoints)}, the rest "
            f"{duration(rest)} (start-up, logging)",
        )
    ]
    speed = []
    for name, unit in (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s")):
        value = _weighted(records, name)
        if value is not None:
            speed.append(f"{rate(value)} {unit}")
    memory = [r["peak_memory_mb"] for r in records if "peak_memory_mb" in r]
    if memory:
        speed.append(f"peak memory {max(memory):,.0f} MB")
    tflops, mfu = _weighted(records, "achieved_tflops"), _weighted(records, "mfu")
    if tflops is not None:
        speed.append(f"{tflops:.3g} TFLOP/s" + (f", MFU {mfu:.1%}" if mfu is not None else ""))
    if speed:
        rows.append(("speed", " | ".join(speed)))
    if share > DATA_WAIT_ADVICE_SHARE:
        rows.append(("advice", data_wait_advice(share, cfg)))
    return rows
