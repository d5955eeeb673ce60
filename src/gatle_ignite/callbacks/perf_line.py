"""``perf/`` figures in one short line: the text backend's epoch line and the run summary's.

The figures themselves are measured by ``gatle_ignite.trainer.telemetry``; this module only
names and formats them.
"""

from typing import Optional

__all__ = [
    "PERF_PREFIX",
    "TFLOPS_SHOWN",
    "duration",
    "is_perf_record",
    "perf_line",
    "rate",
    "shows_tflops",
]

PERF_PREFIX = "perf/"
# Achieved TFLOP/s is shown where it says something of the hardware: beside an MFU (a device of
# known peak), or from 10 GFLOP/s up. Below that a step is Python and launch overheads, not
# arithmetic: a small model on the CPU makes 1e-4 TFLOP/s, a figure that only looks precise.
TFLOPS_SHOWN = 0.01


def shows_tflops(tflops: Optional[float], mfu: Optional[float]) -> bool:
    """Whether an achieved ``tflops`` (with ``mfu``, None off a known device) is worth showing."""
    return tflops is not None and (mfu is not None or tflops >= TFLOPS_SHOWN)


def is_perf_record(metrics) -> bool:
    return bool(metrics) and all(name.startswith(PERF_PREFIX) for name in metrics)


def duration(seconds: float) -> str:
    """``0.042 s``, ``12.5 s``, ``754 s``, ``1:02:03`` from an hour on."""
    if seconds >= 3600:
        whole = int(seconds)
        return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


def rate(value: float) -> str:
    """``9,500``, ``12.3k``, ``4.56M``, ``0.5``."""
    for threshold, unit, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if value >= threshold:
            return f"{value / unit:.3g}{suffix}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _percent(share: float) -> str:
    return f"{share:.0%}" if share >= 0.01 or share == 0 else "<1%"


def _get(metrics, name: str) -> Optional[float]:
    return metrics.get(f"{PERF_PREFIX}{name}")


def perf_line(metrics) -> str:
    """One epoch's ``perf/`` record as a line of its figures, the ones it holds."""
    parts = []
    epoch, train = _get(metrics, "epoch_time_s"), _get(metrics, "train_time_s")
    if epoch is not None:
        parts.append(f"epoch {duration(epoch)}")
    spent = []
    if train is not None:
        wait = _get(metrics, "data_wait_share")
        waited = f" (data wait {_percent(wait)})" if wait is not None else ""
        spent.append(f"train {duration(train)}{waited}")
    for name, label in (("eval_time_s", "eval"), ("checkpoint_stall_s", "checkpoint")):
        value = _get(metrics, name)
        if value:
            spent.append(f"{label} {duration(value)}")
    if spent:
        parts.append(", ".join(spent))
    for name, unit in (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s")):
        value = _get(metrics, name)
        if value is not None:
            parts.append(f"{rate(value)} {unit}")
    memory = _get(metrics, "peak_memory_mb")
    if memory is not None:
        parts.append(f"peak {memory:,.0f} MB")
    tflops, mfu = _get(metrics, "achieved_tflops"), _get(metrics, "mfu")
    if shows_tflops(tflops, mfu):
        parts.append(f"{tflops:.3g} TFLOP/s" + (f", MFU {mfu:.1%}" if mfu is not None else ""))
    return " | ".join(parts)
