"""Evaluation cost per batch: gatle-ignite's evaluator against a bare ``torch.no_grad()`` loop.

    python -m bench.eval_step [--reps 5]

Each variant scores top-1 accuracy of the freshly seeded synthetic MLP over 4096 validation
samples (64 batches of 64), ten passes in one fresh process; the first pass is dropped.
"""

import argparse
import json
from pathlib import Path

from bench import common

EVAL_N = 4096
PASSES = 10
VARIANTS = {
    "bare": "bare torch.no_grad() loop",
    "engine": "bare ignite Engine + Accuracy",
    "gatle": "gatle-ignite evaluator (evaluate())",
}
TARGET = 1.10
ACC_TOLERANCE = 1e-9


def _batches():
    return -(-EVAL_N // common.BATCH)


def run_bare():
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(common.SEED)
    loader = common.eval_loader(common.synthetic_tensors("valid", n=EVAL_N))
    model = common.mlp().eval()
    spans, accuracy = [], None
    for _ in range(PASSES):
        start = common.clock()
        correct = total = 0
        with torch.no_grad():
            for x, y in loader:
                correct += int((model(x).argmax(dim=1) == y).sum())
                total += len(y)
        accuracy = correct / total
        spans.append((start, common.clock()))
    return {"spans": spans, "accuracy": accuracy}


def run_engine():
    import torch
    from ignite.engine import Engine, Events
    from ignite.metrics import Accuracy

    torch.set_num_threads(1)
    torch.manual_seed(common.SEED)
    loader = common.eval_loader(common.synthetic_tensors("valid", n=EVAL_N))
    model = common.mlp().eval()

    def step(_engine, batch):
        x, y = batch
        with torch.no_grad():
            return model(x), y

    engine = Engine(step)
    Accuracy().attach(engine, "acc")
    starts, ends = [], []
    engine.add_event_handler(Events.EPOCH_STARTED, lambda _e: starts.append(common.clock()))
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda _e: ends.append(common.clock()))
    for _ in range(PASSES):
        engine.run(loader, max_epochs=1)
    return {"spans": list(zip(starts, ends)), "accuracy": engine.state.metrics["acc"]}


def run_gatle():
    """``BaseTrainer.evaluate`` in inference mode, as ``gatle-ignite eval`` runs it."""
    import torch

    from bench.tasks.trainer import Trainer
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file

    torch.set_num_threads(1)
    cfg = load_config_from_file(common.ROOT / common.CONFIG)
    apply_overrides(cfg, [f"valid_ds_params.n={EVAL_N}"])
    cfg.run = True
    trainer = Trainer(0, cfg)
    results = {}
    for _ in range(PASSES):
        # No checkpoint: the freshly seeded weights are the ones the bare loops score.
        results = trainer.evaluate(load_checkpoint=False)
    spans = list(zip(trainer.record["eval_start"], trainer.record["eval_end"]))
    return {"spans": spans, "accuracy": results["valid/acc"]}


CHILDREN = {"bare": run_bare, "engine": run_engine, "gatle": run_gatle}


def _per_batch(spans):
    """``(wall, cpu)`` per batch, the median over the passes after the first."""
    walls = [(end[0] - start[0]) / _batches() for start, end in spans[1:]]
    cpus = [(end[1] - start[1]) / _batches() for start, end in spans[1:]]
    return common.median(walls), common.median(cpus)


def run(reps=5):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== evaluation batch ==")
    names = list(VARIANTS)
    times = {name: [] for name in names}
    accuracy = {}
    for rep in range(reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            result = common.run_child("bench.eval_step", ["--child", name])
            times[name].append(_per_batch(result["spans"]))
            accuracy[name] = result["accuracy"]
    base = times["bare"]
    rows, ratios = [], {}
    for name, values in times.items():
        ratios[name] = [common.median([v[i] / b[i] for v, b in zip(values, base)]) for i in (0, 1)]
        rows.append(
            [
                VARIANTS[name],
                common.ms(common.median([v[0] for v in values])),
                common.ms(common.median([v[1] for v in values])),
                f"{ratios[name][0]:.3f}x",
                f"{ratios[name][1]:.3f}x",
                f"{common.spread([v[0] for v in values]):.0f}%",
                f"{accuracy[name]:.4f}",
            ]
        )
    headers = ["variant", "wall ms/batch", "cpu ms/batch", "wall ratio", "cpu ratio", "±", "acc"]
    text = common.table(headers, rows)
    print(text)
    deviation = max(abs(a - accuracy["bare"]) for a in accuracy.values())
    checks = [
        common.Check(
            "eval: gatle-ignite evaluator batch",
            ratios["gatle"][1],
            TARGET,
            note=f"wall {ratios['gatle'][0]:.3f}x; ignite Engine alone {ratios['engine'][1]:.3f}x",
        ),
        common.Check("eval: same accuracy, every variant", deviation, ACC_TOLERANCE, unit=""),
    ]
    return text, checks


def main():
    parser = common.out_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(CHILDREN[args.child]()))
        return
    _, checks = run(args.reps)
    print(common.checks_table(checks))


if __name__ == "__main__":
    main()
