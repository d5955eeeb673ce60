"""What each piece of gatle-ignite's training loop costs, measured inside one process.

    python -m bench.ablate [--reps 5] [--epochs 100] [PIECE[,PIECE...] ...]

Separate processes differ by several percent from their memory layout alone, more than most
pieces cost, so one run trains the bench config (every extra off) with odd epochs complete and
even epochs without the named pieces; a piece costs the difference of the two kinds' median CPU
time per iteration (after two warm-up epochs), the median over ``--reps`` fresh processes.

Pieces: ``progress`` (the TRAIN printer), ``losses`` (the trainer's per-step bookkeeping of
its losses: the loss averages' part and the non-finite check's, a read per step at
check_every=1), ``log_point`` (a metrics.csv point, every iteration on this task's 32-iteration
epoch), ``criterion`` (the composite loss, replaced by one ``F.cross_entropy``), ``step``
(train_step, prep_batch and the model's dict wrapper, replaced by the bare loop's statements),
``telemetry`` (the clock reads around each batch fetch, on ``GET_BATCH_STARTED`` /
``GET_BATCH_COMPLETED``); join pieces with commas to remove them together. It edits ignite's
private ``Engine._event_handlers``.
"""

import contextlib
import os
import statistics
import tempfile
import time

from bench import common
from bench.tasks.trainer import Trainer as BenchTrainer
from gatle_ignite.trainer.handlers import StepLosses

WARMUP = 2
# piece -> the qualname of the ITERATION_COMPLETED handler it removes
HANDLERS = {
    "progress": "ProgressLines.report",
    "losses": "StepLosses",
    "log_point": "LoggingCallback.on_train_epoch_end.<locals>._log_lr_and_loss",
}
# piece -> {event name: the qualname of the handler it removes there}, for other events
FETCH_HANDLERS = {
    "telemetry": {
        "GET_BATCH_STARTED": "Telemetry._fetch_started",
        "GET_BATCH_COMPLETED": "Telemetry._fetch_completed",
    },
}
PIECES = (*HANDLERS, "criterion", "step", *FETCH_HANDLERS)
DEFAULT = (*PIECES, "progress,losses,log_point", "progress,losses,log_point,step")


def _qualname(handler):
    function = handler[0]
    return getattr(function, "__qualname__", type(function).__qualname__)


class AlternatingTrainer(BenchTrainer):
    """Runs odd epochs complete and even epochs without ``self.pieces``."""

    pieces = ()
    bare = ()  # the pieces replaced in the current epoch

    def attach_progress(self):
        import torch
        from ignite.engine import Events

        # The last of fit()'s attachments: every handler of the run is in place.
        super().attach_progress()
        trainer = self.engines["trainer"]
        handlers = trainer._event_handlers[Events.ITERATION_COMPLETED]
        full = list(handlers)
        removed = {HANDLERS[p] for p in self.pieces if p in HANDLERS}
        reduced = [h for h in full if _qualname(h) not in removed]
        averages = StepLosses.of(trainer).averages
        # (the event's live handler list, all of them, those kept in a reduced epoch)
        fetches = []
        for name in ("GET_BATCH_STARTED", "GET_BATCH_COMPLETED"):
            live = trainer._event_handlers[getattr(Events, name)]
            gone = {FETCH_HANDLERS[p][name] for p in self.pieces if p in FETCH_HANDLERS}
            fetches.append((live, list(live), [h for h in live if _qualname(h) not in gone]))
        self.per_iteration = {True: [], False: []}
        started = {}

        def start(engine):
            complete = engine.state.epoch % 2 == 1
            handlers[:] = full if complete else reduced
            for live, every, kept in fetches:
                live[:] = every if complete else kept
            self.bare = () if complete else self.pieces
            started["cpu"] = time.process_time()

        def stop(engine):
            complete = engine.state.epoch % 2 == 1
            spent = time.process_time() - started["cpu"]
            self.per_iteration[complete].append(spent / engine.state.epoch_length)
            if not complete and "losses" in self.pieces:
                # An epoch's averages need an example to compute; this one is a placeholder.
                for average in averages:
                    average.update(torch.zeros(()))

        # First of their events, so the clock covers every other handler of the epoch.
        for event, handler in ((Events.EPOCH_STARTED, start), (Events.EPOCH_COMPLETED, stop)):
            trainer.add_event_handler(event, handler)
            trainer._event_handlers[event].insert(0, trainer._event_handlers[event].pop())

    def train_step(self, engine, batch, split="train"):
        if "step" not in self.bare:
            return super().train_step(engine, batch, split)
        loss = common.bare_step(self.model.net, self.optimizer, *batch)
        losses = {"loss": loss, **{f"loss_{key}": loss for key in self.criterion.crit_keys}}
        return {"y_pred": None, "target": None, "losses": losses}

    def loss_fn(self, y_pred, target, **kwargs):
        if "criterion" not in self.bare:
            return super().loss_fn(y_pred, target, **kwargs)
        import torch.nn.functional as F

        loss = F.cross_entropy(y_pred["logits"], target["targets"]["labels"])
        return loss, {f"loss_{key}": loss for key in self.criterion.crit_keys}


def child(pieces, args):
    """``[with, without]`` median CPU seconds per iteration, alternating in one run."""
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file

    with tempfile.TemporaryDirectory(prefix="gatle-bench-ablate-") as tmp:
        cfg = load_config_from_file(common.ROOT / common.CONFIG)
        overrides = [f"save_dir={tmp}/run", f"max_epochs={args.epochs}", *common.EXTRAS_OFF]
        apply_overrides(cfg, overrides)
        AlternatingTrainer.pieces = tuple(pieces.split(","))
        trainer = AlternatingTrainer(0, cfg)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            trainer.fit()
    kept = {kind: values[WARMUP // 2 :] for kind, values in trainer.per_iteration.items()}
    return [statistics.median(kept[True]), statistics.median(kept[False])]


def run(reps=None, epochs=100, pieces=DEFAULT):
    """Measure and print the table (bench.run_all calls this); a diagnostic, so no checks."""
    unknown = sorted(set(",".join(pieces).split(",")) - set(PIECES))
    if unknown:
        raise SystemExit(f"unknown piece(s) {unknown}; choose from {', '.join(PIECES)}")
    print("== ablation: each piece's in-loop cost ==")
    results = common.interleaved("bench.ablate", list(pieces), reps or 5, ["--epochs", str(epochs)])
    rows = []
    for piece, values in results.items():
        full, without = (common.median([v[i] for v in values]) * 1e6 for i in (0, 1))
        costs = [(v[0] - v[1]) * 1e6 for v in values]
        cost = common.median(costs)
        rows.append([piece, f"{full:.1f}", f"{without:.1f}", f"{cost:.1f}"])
        rows[-1] += [f"{min(costs):.1f} .. {max(costs):.1f}", f"{cost / full:.1%}"]
    headers = ["without", "us/iter, all", "us/iter, without", "cost us/iter", "range", "share"]
    text = common.table(headers, rows)
    print(text)
    return text, []


if __name__ == "__main__":
    options = [
        ("--epochs", {"type": int, "default": 100}),
        ("pieces", {"nargs": "*", "default": list(DEFAULT), "help": ", ".join(PIECES)}),
    ]
    common.main(__doc__, run, child, options)
