"""Where gatle-ignite's time goes beyond a bare Engine: a handler census and step micro-costs.

    python -m bench.overhead [--config off|defaults] [--profile PATH]

1. Handler census: the bench config trains for 20 epochs with every handler of every engine
   wrapped in a CPU-time counter (``time.thread_time_ns``), giving each handler's cost per call
   and per training iteration. It reads ignite's private ``Engine._event_handlers``: a
   diagnostic, not a benchmark.
2. Step micro-costs: the pieces of ``BaseTrainer.train_step`` and ``eval_step`` timed alone
   with ``timeit`` (best of 7) on the built trainer, against the bare loop's own statements.

``--profile PATH`` also writes a cProfile of the census run, for ``python -m pstats PATH``.
"""

import argparse
import contextlib
import cProfile
import os
import tempfile
import time
import timeit
from collections import defaultdict

from bench import common
from bench.tasks.trainer import Trainer as BenchTrainer

CONFIGS = {
    "off": ("logger_name=[]", "every_val=0", "save_ckpt=False", "score_name=None"),
    "defaults": (),
}


def _name(func):
    inner = getattr(func, "__wrapped__", func)
    if hasattr(inner, "__qualname__"):
        return f"{inner.__module__.split('.')[0]}:{inner.__qualname__}"
    return f"{type(inner).__module__.split('.')[0]}:{type(inner).__qualname__}"


class CensusTrainer(BenchTrainer):
    """Wraps every handler of every engine, once they are all attached, in a CPU-time counter."""

    totals = defaultdict(lambda: [0, 0])

    def attach_progress(self):
        super().attach_progress()
        for key, engine in self.engines.items():
            if engine is None:
                continue
            for event, handlers in engine._event_handlers.items():
                handlers[:] = [
                    (
                        self._counted(
                            func,
                            (key, getattr(event, "name", str(event)), _name(func)),
                            self.totals,
                        ),
                    )
                    + tuple(rest)
                    for func, *rest in handlers
                ]

    @staticmethod
    def _counted(func, label, totals):
        def counted(*args, **kwargs):
            start = time.thread_time_ns()
            try:
                return func(*args, **kwargs)
            finally:
                entry = totals[label]
                entry[0] += 1
                entry[1] += time.thread_time_ns() - start

        return counted


def census(config, profile=None):
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file

    with tempfile.TemporaryDirectory(prefix="gatle-bench-census-") as tmp:
        cfg = load_config_from_file(common.ROOT / common.CONFIG)
        apply_overrides(cfg, [f"save_dir={tmp}", *CONFIGS[config]])
        trainer = CensusTrainer(0, cfg)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            if profile:
                cProfile.runctx("trainer.fit()", globals(), {"trainer": trainer}, profile)
            else:
                trainer.fit()
    iterations = common.EPOCHS * common.ITERS_PER_EPOCH
    rows = []
    ranked = sorted(CensusTrainer.totals.items(), key=lambda item: -item[1][1])
    for (engine, event, name), (calls, ns) in ranked:
        if ns / iterations < 50:  # below 0.05 us per iteration: noise
            continue
        rows.append(
            [engine, event, name, calls, f"{ns / calls / 1e3:.1f}", f"{ns / iterations / 1e3:.2f}"]
        )
    headers = ["engine", "event", "handler", "calls", "us/call", "us/train iter"]
    probe = CensusTrainer._counted(lambda: None, "probe", defaultdict(lambda: [0, 0]))
    text = common.table(headers, rows)
    return text + f"\n\nEach figure includes the counter's own {_best_us(probe):.1f} us per call."


def _best_us(func, number=300):
    """Best of 7 repeats, in microseconds per call."""
    return min(timeit.repeat(func, number=number, repeat=7)) / number * 1e6


def micro_costs():
    """The pieces of one training and one evaluation step, each timed alone."""
    import ignite.distributed as idist
    import torch
    import torch.nn.functional as F

    from gatle_ignite.config.loader import apply_overrides, load_config_from_file
    from gatle_ignite.utils.batch import to_device

    torch.set_num_threads(1)
    cfg = load_config_from_file(common.ROOT / common.CONFIG)
    apply_overrides(cfg, ["save_dir=/nonexistent", *CONFIGS["off"]])
    trainer = BenchTrainer(0, cfg).setup()
    engine = trainer.engines["trainer"]
    engine.state.iteration, engine.state.epoch_length = 1, common.ITERS_PER_EPOCH
    batch = next(iter(trainer.dls["train"]))
    x, y = batch
    prepared = trainer.prep_batch(batch)
    net = trainer.model.net
    y_pred = trainer.forward(prepared["model_input"])
    optimizer = trainer.optimizer

    def bare_step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()

    def gatle_backward_pair():
        loss, _ = trainer.loss_fn(trainer.forward(prepared["model_input"]), prepared, iteration=1)
        loss.backward()

    def bare_backward_pair():
        F.cross_entropy(net(x), y).backward()

    def autocast_off():
        with torch.autocast(device_type="cpu", dtype=torch.float32, enabled=False):
            pass

    def eval_bare():
        with torch.no_grad():
            net(x)

    rows = [
        ("train step: BaseTrainer.train_step", lambda: trainer.train_step(engine, batch)),
        ("train step: bare (zero_grad, forward, CE, backward, step)", bare_step),
        ("  forward + loss + backward: gatle (forward, loss_fn)", gatle_backward_pair),
        ("  forward + loss + backward: bare (net, F.cross_entropy)", bare_backward_pair),
        ("  loss_fn (composite, 1 term) forward only", lambda: trainer.loss_fn(y_pred, prepared)),
        ("  F.cross_entropy forward only", lambda: F.cross_entropy(y_pred["logits"], y)),
        ("  prep_batch (to_device of the nested dict)", lambda: trainer.prep_batch(batch)),
        ("    to_device(batch) alone", lambda: to_device(batch)),
        ("    idist.device()", idist.device),
        ("  model.train() (the module walk; skipped when in mode)", trainer.model.train),
        ("  torch.autocast(enabled=False) enter + exit", autocast_off),
        ("eval step: BaseTrainer.eval_step", lambda: trainer.eval_step(engine, batch)),
        ("eval step: bare (torch.no_grad(), net(x))", eval_bare),
    ]
    table_rows = [[label, f"{_best_us(func):.1f}"] for label, func in rows]
    return common.table(["piece", "us/call"], table_rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="off")
    parser.add_argument("--profile", help="write a cProfile of the census run here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"== handler census: gatle-ignite {args.config} ==")
    print(census(args.config, args.profile))
    print("\n== step micro-costs ==")
    print(micro_costs())


if __name__ == "__main__":
    main()
