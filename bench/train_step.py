"""Per-iteration training cost: gatle-ignite against the loops it replaces.

    python -m bench.train_step [--reps 7]

Every variant trains the synthetic example's MLP on its data (2048 x 64, batch 64, shuffled)
for 20 epochs from seed 42, in its own fresh process with one torch thread. Time per iteration
is read from inside, at epoch ends: the fastest of epochs 2..20. Variants run interleaved, and
each ratio is taken against the bare loop of the same repetition. With GATLE_BENCH_BASELINE set, the
gatle-ignite variants also run from that checkout.
"""

import os
import tempfile

from bench import common

VARIANTS = {
    "bare": "bare PyTorch loop",
    "bare_ckpt": "bare loop + torch.save, print per epoch",
    "bare_extras": "bare loop + eval, torch.save, print per epoch",
    "engine": "bare ignite Engine",
    "gatle_off": "gatle-ignite, every extra off",
    "gatle_off_k32": "gatle-ignite, every extra off, check_every=32",
    "gatle_usual": "gatle-ignite, progress, csv, a checkpoint per epoch",
    "gatle_defaults": "gatle-ignite defaults (text log, eval, ckpt)",
}
# variant -> (limit, the bare variant it is measured against)
TARGETS = {
    "gatle_off": (1.05, "bare"),
    "gatle_usual": (1.10, "bare_ckpt"),
    "gatle_defaults": (1.25, "bare"),
}
# Every extra off: no evaluation, checkpoint, logger or progress line (metrics.csv stays).
OFF = (*common.EXTRAS_OFF, "verbosity=0")
# What most runs keep on: the progress lines, the csv history, a checkpoint per epoch.
USUAL = ("logger_name=['csv']", "every_val=0", "score_name=None")
# Evaluating draws a DataLoader seed from the global RNG, which moves every later shuffle, so
# the variants that evaluate each epoch are compared with the bare loop that does too.
EVALUATING = ("bare_extras", "gatle_defaults")
LOSS_RTOL = 1e-5


def _accuracy(model, valid):
    import torch

    correct = total = 0
    model.eval()
    with torch.no_grad():
        for x, y in valid:
            correct += int((model(x).argmax(dim=1) == y).sum())
            total += len(y)
    model.train()
    return correct / total


def run_bare(extras=False, checkpoint=False):
    import torch

    tensors, train, model, optimizer = common.seeded_task()
    valid = common.loader(common.synthetic_tensors("valid"), train=False) if extras else None
    save_dir = tempfile.mkdtemp(prefix="gatle-bench-bare-")
    stamps = []
    for epoch in range(1, common.EPOCHS + 1):
        for x, y in train:
            loss = common.bare_step(model, optimizer, x, y)
        if extras or checkpoint:
            acc = f" valid/acc {_accuracy(model, valid):.4f}" if extras else ""
            print(f"epoch {epoch}: train/loss {float(loss):.4f}{acc}")
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, os.path.join(save_dir, "latest.pt"))
        stamps.append(common.clock())
    return {"train": stamps, "final_loss": common.final_loss(model, tensors)}


def run_engine():
    from ignite.engine import Engine, Events

    tensors, train, model, optimizer = common.seeded_task()
    stamps = []
    engine = Engine(lambda _engine, batch: common.bare_step(model, optimizer, *batch))
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda _engine: stamps.append(common.clock()))
    engine.run(train, max_epochs=common.EPOCHS)
    return {"train": stamps, "final_loss": common.final_loss(model, tensors)}


CHILDREN = {
    "bare": run_bare,
    "bare_ckpt": lambda: run_bare(checkpoint=True),
    "bare_extras": lambda: run_bare(extras=True),
    "engine": run_engine,
    "gatle_off": lambda: common.run_gatle(OFF),
    "gatle_off_k32": lambda: common.run_gatle((*OFF, "check_every=32")),
    "gatle_usual": lambda: common.run_gatle(USUAL),
    "gatle_defaults": lambda: common.run_gatle(()),
}


def child(variant, _args):
    result = CHILDREN[variant.partition("@")[0]]()
    result["per_iteration"] = common.per_iteration(result.pop("train"), common.ITERS_PER_EPOCH)
    return result


def _loss_deviation(results):
    """The largest relative difference of a final loss from its bare loop's."""

    def reference(name):
        bare = "bare_extras" if name.partition("@")[0] in EVALUATING else "bare"
        return results[bare][0]["final_loss"]

    return max(
        abs(r["final_loss"] - reference(name)) / reference(name)
        for name, values in results.items()
        for r in values
    )


def run(reps=None):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== training iteration ==")
    names = common.with_baseline(VARIANTS, ("gatle_off", "gatle_usual"))
    results = common.interleaved("bench.train_step", names, reps or 7)
    times = {name: [r["per_iteration"] for r in values] for name, values in results.items()}
    text, _ratios = common.ratio_table(times, "bare", VARIANTS, "iter")
    print(text)
    checks = []
    for name in times:
        if not name.startswith("gatle"):
            continue
        limit, base = TARGETS.get(name.partition("@")[0], (None, "bare"))
        if "@" in name:
            limit = None  # a baseline variant has no target: it is the "before"
        ratio = common.paired_ratio(*([t[1] for t in times[n]] for n in (name, base)))
        label = f"train: {common.label(VARIANTS, name)} vs {VARIANTS[base]}, CPU"
        checks.append(common.Check(label, ratio, limit))
    for name, reference in (("gatle_off", "engine"), ("gatle_defaults", "bare_extras")):
        ratio = common.paired_ratio(*([t[1] for t in times[n]] for n in (name, reference)))
        checks.append(
            common.Check(f"train: {VARIANTS[name]} vs {VARIANTS[reference]}", ratio, None)
        )
    deviation = _loss_deviation(results)
    checks.append(common.Check("train: same final loss, every variant", deviation, LOSS_RTOL, ""))
    return text, checks


if __name__ == "__main__":
    common.main(__doc__, run, child)
