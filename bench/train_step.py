"""Per-iteration training cost: gatle-ignite against the loops it replaces.

    python -m bench.train_step [--reps 5]

Every variant trains the synthetic example's MLP on its data (2048 x 64, batch 64, shuffled)
for 20 epochs from seed 42, in its own fresh process with one torch thread. Time per iteration
is read from inside, at epoch ends, over epochs 2..20; variants run interleaved, in a rotated
order each repetition, and each ratio is taken against the bare loop of the same repetition.
"""

import argparse
import importlib.util
import json
import os
import tempfile
from pathlib import Path

from bench import common

EXTRAS_OFF = ("logger_name=[]", "every_val=0", "save_ckpt=False", "score_name=None")
VARIANTS = {
    "bare": "bare PyTorch loop",
    "bare_extras": "bare loop + eval, torch.save, print per epoch",
    "engine": "bare ignite Engine",
    "gatle_off": "gatle-ignite, every extra off",
    "gatle_defaults": "gatle-ignite defaults (text log, eval, ckpt)",
    "lightning": "Lightning barebones=True",
}
TARGETS = {"gatle_off": 1.10, "gatle_defaults": 1.25}
# Evaluating draws a DataLoader seed from the global RNG, which moves every later shuffle, so
# the variants that evaluate each epoch are compared with the bare loop that does too.
EVALUATING = ("bare_extras", "gatle_defaults")
LOSS_RTOL = 1e-5


def _setup(with_model=True):
    """Seed, then data, then the model: the order in which gatle-ignite draws from the seed."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(common.SEED)
    tensors = common.synthetic_tensors()
    if not with_model:
        return tensors, common.train_loader(tensors), None, None
    model = common.mlp()
    return tensors, common.train_loader(tensors), model, common.adamw(model)


def _step(model, optimizer, batch):
    import torch.nn.functional as F

    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def _accuracy(model, loader):
    import torch

    correct = total = 0
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(dim=1) == y).sum())
            total += len(y)
    model.train()
    return correct / total


def run_bare(extras=False):
    import torch

    tensors, loader, model, optimizer = _setup()
    valid = common.eval_loader(common.synthetic_tensors("valid")) if extras else None
    save_dir = tempfile.mkdtemp(prefix="gatle-bench-bare-")
    stamps = []
    for epoch in range(1, common.EPOCHS + 1):
        for batch in loader:
            loss = _step(model, optimizer, batch)
        if extras:
            acc = _accuracy(model, valid)
            print(f"epoch {epoch}: train/loss {float(loss):.4f} valid/acc {acc:.4f}")
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, os.path.join(save_dir, "latest.pt"))
        stamps.append(common.clock())
    return {"train": stamps, "final_loss": common.final_loss(model, tensors)}


def run_engine():
    from ignite.engine import Engine, Events

    tensors, loader, model, optimizer = _setup()
    stamps = []
    engine = Engine(lambda _engine, batch: _step(model, optimizer, batch))
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda _engine: stamps.append(common.clock()))
    engine.run(loader, max_epochs=common.EPOCHS)
    return {"train": stamps, "final_loss": common.final_loss(model, tensors)}


def run_gatle(overrides):
    """``gatle-ignite train`` on the bench config, in this process, as a user runs it."""
    import torch

    from gatle_ignite.cli.main import main

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="gatle-bench-") as tmp:
        record = Path(tmp) / "record.json"
        os.environ[common.RECORD_ENV] = str(record)
        args = ["train", f"--config={common.CONFIG}", f"--override=save_dir={tmp}/run"]
        code = main(args + [f"--override={item}" for item in overrides])
        if code != 0:
            raise SystemExit(code)
        return json.loads(record.read_text())


def run_lightning():
    import lightning as L
    import torch.nn.functional as F

    # The LightningModule builds the model itself, right after the data as everywhere else.
    tensors, loader, _, _ = _setup(with_model=False)
    stamps = []

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = common.mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return common.adamw(self.net)

    class Stamp(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            stamps.append(common.clock())

    module = Net()
    trainer = L.Trainer(
        barebones=True,
        max_epochs=common.EPOCHS,
        accelerator="cpu",
        devices=1,
        callbacks=[Stamp()],
    )
    trainer.fit(module, loader)
    return {"train": stamps, "final_loss": common.final_loss(module.net, tensors)}


def run_child(variant):
    if variant == "bare":
        return run_bare()
    if variant == "bare_extras":
        return run_bare(extras=True)
    if variant == "engine":
        return run_engine()
    if variant == "gatle_off":
        return run_gatle(EXTRAS_OFF)
    if variant == "gatle_defaults":
        return run_gatle(())
    if variant == "lightning":
        return run_lightning()
    raise SystemExit(f"unknown variant {variant!r}")


def available_variants():
    names = list(VARIANTS)
    if importlib.util.find_spec("lightning") is None:
        names.remove("lightning")
    return names


def measure(reps, variants):
    """``{variant: [(wall, cpu) per iteration, one per repetition]}`` and the final losses."""
    times = {name: [] for name in variants}
    losses = {name: [] for name in variants}
    for rep in range(reps):
        # Rotated, so no variant always runs first (or always right after another).
        order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
        for name in order:
            result = common.run_child("bench.train_step", ["--child", name])
            times[name].append(common.per_iteration(result["train"], common.ITERS_PER_EPOCH))
            losses[name].append(result["final_loss"])
            print(f"  rep {rep + 1}/{reps} {name}: {times[name][-1][0] * 1e3:.3f} ms/iter")
    return times, losses


def report(times, losses):
    """The figures table and the issue's checks, from :func:`measure`'s results."""
    base = times["bare"]
    rows, ratios = [], {}
    for name, values in times.items():
        wall = [v[0] for v in values]
        cpu = [v[1] for v in values]
        ratio_wall = common.median([w / b[0] for w, b in zip(wall, base)])
        ratio_cpu = common.median([c / b[1] for c, b in zip(cpu, base)])
        ratios[name] = (ratio_wall, ratio_cpu)
        rows.append(
            [
                VARIANTS[name],
                common.ms(common.median(wall)),
                common.ms(common.median(cpu)),
                f"{ratio_wall:.3f}x",
                f"{ratio_cpu:.3f}x",
                f"{common.spread(wall):.0f}%",
                f"{losses[name][0]:.6f}",
            ]
        )
    headers = ["variant", "wall ms/iter", "cpu ms/iter", "wall ratio", "cpu ratio", "±", "loss"]
    text = common.table(headers, rows)
    deviation = 0.0
    for name, values in losses.items():
        reference = losses["bare_extras" if name in EVALUATING else "bare"][0]
        deviation = max(deviation, *(abs(v - reference) / abs(reference) for v in values))
    checks = [
        common.Check(
            f"train: {VARIANTS[name]}",
            ratios[name][1],
            limit,
            note=f"wall {ratios[name][0]:.3f}x",
        )
        for name, limit in TARGETS.items()
    ]
    for name, reference in (("gatle_off", "engine"), ("gatle_defaults", "bare_extras")):
        paired = zip(times[name], times[reference])
        ratio = common.median([value[1] / ref[1] for value, ref in paired])
        checks.append(
            common.Check(f"train: {VARIANTS[name]} vs {VARIANTS[reference]}", ratio, None)
        )
    checks.append(
        common.Check("train: same final loss, every variant", deviation, LOSS_RTOL, unit="")
    )
    return text, checks


def run(reps=5):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== training iteration ==")
    times, losses = measure(reps, available_variants())
    text, checks = report(times, losses)
    print(text)
    return text, checks


def main():
    parser = common.out_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(run_child(args.child)))
        return
    _, checks = run(args.reps)
    print(common.checks_table(checks))


if __name__ == "__main__":
    main()
