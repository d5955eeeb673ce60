"""The default sink: one block per epoch on stdout, every engine's metrics together."""

import numbers
import sys

from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.callbacks.perf_line import is_perf_record, perf_line

__all__ = ["Backend", "format_value"]


def format_value(value) -> str:
    """A number (or a one-element tensor) to 5 significant digits, anything else as it is."""
    if callable(getattr(value, "numel", None)) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(value)
    return f"{value:.5g}"


def _by_engine(metrics) -> dict:
    """``{"train": {"loss_avg": ...}, "valid": {"acc": ...}}`` from ``train/loss_avg`` names,
    the trainer's first."""
    grouped = {"train": {}}
    for name, value in metrics.items():
        engine, _, metric = name.rpartition("/")
        grouped.setdefault(engine, {})[metric] = value
    return {engine: values for engine, values in grouped.items() if values}


def render_perf(metrics) -> str:
    """An epoch's perf/ record, logged after its checkpoint: one line under its block."""
    return f"{'perf':<5}  {perf_line(metrics)}\n"


def render_block(metrics, step=None, epoch=None, max_epochs=None) -> str:
    """The text of one record: a header, then a line per engine."""
    of = f"/{max_epochs}" if max_epochs else ""
    where = f"epoch {epoch}{of}" if epoch is not None else f"step {step}"
    if epoch is not None and step is not None:
        where += f" (iteration {step})"
    grouped = _by_engine(metrics)
    width = max(len(engine) for engine in grouped)
    lines = [f"--- {where} ---"]
    for engine, values in grouped.items():
        shown = "  ".join(f"{name} {format_value(value)}" for name, value in values.items())
        lines.append(f"{engine:<{width}}  {shown}")
    return "\n".join(lines) + "\n"


class Backend(BaseBackend):
    """Epoch records only: the per-iteration points would drown the progress lines."""

    per_iteration = False

    def log(self, metrics, step=None, epoch=None):
        if not metrics:
            return
        max_epochs = self.cfg.get("max_epochs") if self.cfg is not None else None
        if is_perf_record(metrics):
            block = render_perf(metrics)
        else:
            block = render_block(metrics, step=step, epoch=epoch, max_epochs=max_epochs)
        if self.cfg is not None and "pbar" in self.cfg.get("logger_name", ()):
            from tqdm import tqdm

            # Written around an open progress bar instead of into it.
            tqdm.write(block, end="")
        elif sys.stdout is not None:
            # One write for the block; like print(), nothing when the process has no stdout.
            sys.stdout.write(block)
