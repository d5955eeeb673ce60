"""What one piece of gatle-ignite's training loop costs, measured inside one process.

    python -m bench.ablate [--epochs 100] progress nan loss_averages criterion step

Separate processes differ by several percent from their memory layout alone, more than most
single pieces cost, so this trains once (the bench config, every extra off) and alternates:
odd epochs run everything, even epochs run without the named pieces. The cost of the pieces is
the difference of the median CPU time per iteration of the two kinds of epoch (the first two
epochs are warm-up). Inside a training loop a piece costs far more than ``timeit`` says, because
the tensor work between two calls evicts the Python code and data from the caches.

Pieces: ``progress`` (the TRAIN printer), ``nan`` (TerminateOnNan), ``loss_averages`` (the
per-iteration part of every loss average; an epoch without it averages one placeholder value
instead, so its logged averages are meaningless), ``criterion`` (the
composite loss replaced by one ``F.cross_entropy`` call, the bare loop's), ``step`` (the whole
``train_step``, ``prep_batch`` and the example model's dict wrapper replaced by the bare loop's
statements, reporting the same losses); join several with commas to remove them together.
Each argument runs in its own process. It reads ignite's private
``_event_handlers``: a diagnostic, not a benchmark.
"""

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench import common
from bench.tasks.trainer import Trainer as BenchTrainer

EXTRAS_OFF = ("logger_name=[]", "every_val=0", "save_ckpt=False", "score_name=None")
WARMUP = 2
# piece -> the handler names (qualname suffixes) it removes from ITERATION_COMPLETED
HANDLERS = {
    "progress": ("_progress_printer.<locals>.report",),
    "nan": ("_TerminateOnNan",),
    "loss_averages": ("_LossAverage.iteration_completed",),
}
PIECES = (*HANDLERS, "criterion", "step")


def _qualname(func):
    inner = getattr(func, "__wrapped__", func)
    return getattr(inner, "__qualname__", type(inner).__qualname__)


class AlternatingTrainer(BenchTrainer):
    """Runs odd epochs with every handler and even epochs without ``self.pieces``."""

    pieces = ()

    def _prepare_fit(self):
        import torch
        from ignite.engine import Events

        data = super()._prepare_fit()
        trainer = self.engines["trainer"]
        handlers = trainer._event_handlers[Events.ITERATION_COMPLETED]
        removed = {name for piece in self.pieces for name in HANDLERS.get(piece, ())}
        full = list(handlers)
        reduced = [h for h in full if not any(_qualname(h[0]).endswith(n) for n in removed)]
        self.per_iteration = {True: [], False: []}
        started = {}

        def start(engine):
            complete = engine.state.epoch % 2 == 1
            handlers[:] = full if complete else reduced
            self.bare_criterion = not complete and "criterion" in self.pieces
            self.bare_step = not complete and "step" in self.pieces
            started["cpu"] = time.process_time()

        averages = [
            h[0].__self__
            for h in full
            if h not in reduced and _qualname(h[0]).endswith(HANDLERS["loss_averages"])
        ]

        def stop(engine):
            spent = (time.process_time() - started["cpu"]) / engine.state.epoch_length
            complete = engine.state.epoch % 2 == 1
            self.per_iteration[complete].append(spent)
            if not complete:
                # An epoch's averages must have an example to compute; this one is a placeholder.
                for average in averages:
                    average.update(torch.zeros(()))

        # First of their events, so the clock covers every other handler of the epoch.
        for event, handler in ((Events.EPOCH_STARTED, start), (Events.EPOCH_COMPLETED, stop)):
            trainer.add_event_handler(event, handler)
            trainer._event_handlers[event].insert(0, trainer._event_handlers[event].pop())
        return data

    def train_step(self, engine, batch, split="train"):
        if not getattr(self, "bare_step", False):
            return super().train_step(engine, batch, split)
        import torch.nn.functional as F

        x, y = batch
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model.net(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        self.optimizer.step()
        losses = {"loss": loss, **{f"loss_{key}": loss for key in self.criterion.crit_keys}}
        return {"y_pred": {"logits": logits}, "target": None, "losses": losses}

    def loss_fn(self, y_pred, target, **kwargs):
        if getattr(self, "bare_criterion", False):
            import torch.nn.functional as F

            loss = F.cross_entropy(y_pred["logits"], target["targets"]["labels"])
            return loss, {f"loss_{key}": loss for key in self.criterion.crit_keys}
        return super().loss_fn(y_pred, target, **kwargs)


def measure(pieces, epochs):
    """``(with, without)`` median CPU seconds per iteration, alternating in one run."""
    import torch

    from gatle_ignite.config.loader import apply_overrides, load_config_from_file

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="gatle-bench-ablate-") as tmp:
        cfg = load_config_from_file(common.ROOT / common.CONFIG)
        apply_overrides(cfg, [f"save_dir={tmp}", f"max_epochs={epochs}", *EXTRAS_OFF])
        AlternatingTrainer.pieces = tuple(pieces)
        trainer = AlternatingTrainer(0, cfg)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            trainer.fit()
    kept = {kind: values[WARMUP // 2 :] for kind, values in trainer.per_iteration.items()}
    return statistics.median(kept[True]), statistics.median(kept[False])


def main():
    parser = common.out_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("pieces", nargs="*", default=list(PIECES), help=", ".join(PIECES))
    args = parser.parse_args()
    if args.child:
        full, without = measure(args.child.split(","), args.epochs)
        Path(args.out).write_text(json.dumps([full, without]))
        return
    unknown = sorted(set(",".join(args.pieces).split(",")) - set(PIECES))
    if unknown:
        parser.error(f"unknown piece(s) {unknown}; choose from {', '.join(PIECES)}")
    rows = []
    # A fresh process per piece, as the benchmarks run every variant.
    for piece, (full, without) in common.run_each(
        "bench.ablate", args.pieces, ["--epochs", str(args.epochs)]
    ):
        rows.append([piece, *(f"{value * 1e6:.1f}" for value in (full, without, full - without))])
    headers = ["without", "us/iter, all", "us/iter, without", "cost us/iter"]
    print(common.table(headers, rows))


if __name__ == "__main__":
    main()
