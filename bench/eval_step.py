"""Evaluation cost per batch: gatle-ignite's evaluator against a bare ``torch.no_grad()`` loop.

    python -m bench.eval_step [--reps 5]

Each variant scores top-1 accuracy of the freshly seeded synthetic MLP over 4096 validation
samples (64 batches of 64), ten passes in one fresh process, each timed as a whole (a call
of ``evaluate()``, of ``Engine.run``); the fastest pass after the first counts.
"""

from bench import common

EVAL_N = 4096
BATCHES = EVAL_N // common.BATCH
PASSES = 10
VARIANTS = {
    "bare": "bare torch.no_grad() loop",
    "engine": "bare ignite Engine + Accuracy",
    "gatle": "gatle-ignite evaluator (evaluate())",
}
TARGET = 1.10
ACC_TOLERANCE = 1e-9


def _seeded():
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(common.SEED)
    valid = common.loader(common.synthetic_tensors("valid", n=EVAL_N), train=False)
    return valid, common.mlp().eval()


def run_bare():
    import torch

    valid, model = _seeded()

    def one_pass():
        correct = 0
        with torch.no_grad():
            for x, y in valid:
                correct += int((model(x).argmax(dim=1) == y).sum())
        return correct / EVAL_N

    return one_pass


def run_engine():
    import torch
    from ignite.engine import Engine
    from ignite.metrics import Accuracy

    valid, model = _seeded()

    def step(_engine, batch):
        x, y = batch
        with torch.no_grad():
            return model(x), y

    engine = Engine(step)
    Accuracy().attach(engine, "acc")
    return lambda: engine.run(valid, max_epochs=1).metrics["acc"]


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
    # No checkpoint: the freshly seeded weights are the ones the bare loops score.
    return lambda: trainer.evaluate(load_checkpoint=False)["valid/acc"]


CHILDREN = {"bare": run_bare, "engine": run_engine, "gatle": run_gatle}


def child(variant, _args):
    """The accuracy and ``(wall, cpu)`` per batch of the fastest pass after the first."""
    one_pass, spans = CHILDREN[variant](), []
    for _ in range(PASSES):
        start = common.clock()
        accuracy = one_pass()
        spans.append([(end - begin) / BATCHES for begin, end in zip(start, common.clock())])
    per_batch = [min(span[i] for span in spans[1:]) for i in (0, 1)]
    return {"per_batch": per_batch, "accuracy": accuracy}


def run(reps=None):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== evaluation batch ==")
    results = common.interleaved("bench.eval_step", list(VARIANTS), reps or 5)
    times = {name: [r["per_batch"] for r in values] for name, values in results.items()}
    text, ratios = common.ratio_table(times, "bare", VARIANTS, "batch")
    print(text)
    accuracies = [r["accuracy"] for values in results.values() for r in values]
    deviation = max(abs(a - accuracies[0]) for a in accuracies)
    checks = [
        common.Check(
            "eval: gatle-ignite evaluator batch",
            ratios["gatle"][1],
            TARGET,
            note=f"ignite Engine alone {ratios['engine'][1]:.3f}x",
        ),
        common.Check("eval: same accuracy, every variant", deviation, ACC_TOLERANCE, unit=""),
    ]
    return text, checks


if __name__ == "__main__":
    common.main(__doc__, run, child)
