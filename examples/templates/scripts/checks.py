"""Verification for the templates: each contract on its own, then all of them trained together.

Run from the repository root::

    python -m examples.templates.scripts.checks
    python -m examples.templates.scripts.checks --save-dir /tmp/templates_run

Training first empties the run's ``save_dir`` (the config's, unless ``--save-dir`` is given), so
the checks see this run's files only. Exits 0 only when no check failed.
"""

import argparse
import csv
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from ignite.engine import Engine, Events
from torch.utils.data import TensorDataset

from gatle_ignite import base_config, build_dataloader
from gatle_ignite.callbacks.logging import LoggingCallback
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.config.validate import check_dispatch
from gatle_ignite.dispatch import import_entrypoint

PACKAGE = "examples.templates"
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "templates_v0.py"
ENTRYPOINTS = (
    ("trainer", "Trainer"),
    ("model", "Model"),
    ("dataset", "get_ds"),
    ("augmentation", "Transformation"),
    ("loss", "Loss"),
    ("optimizer", "get_optimizer"),
    ("scheduler", "get_scheduler"),
    ("metric", "get_metric"),
    ("sampler", "get_sampler"),
    ("collate", "get_collate_fn"),
    ("backend", "Backend"),
)
METRIC_STATE = ("_num_correct", "_num_examples")


class Report:
    """Collects PASS / FAIL lines and prints the tally."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, observed):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {observed}")

    def finish(self):
        print(f"\n{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def entry(module, name):
    """The entrypoint ``name`` of ``examples.templates.<module>``."""
    return import_entrypoint(f"{PACKAGE}.{module}", name)


def check_entrypoints(report):
    """Each template file exposes its entrypoint under the contract's exact name."""
    for module, name in ENTRYPOINTS:
        try:
            entry(module, name)
            report.check(f"{PACKAGE}.{module} exposes {name}", True, "resolves")
        except Exception as error:  # a broken template is a failed check, not a crash
            report.check(f"{PACKAGE}.{module} exposes {name}", False, repr(error))


def check_metric(report):
    """The metric's compute all-reduces, its state is tensors, and it counts top-2 hits."""
    metric = entry("metric", "get_metric")("valid", {}, k=2)
    wrapped = hasattr(type(metric).compute, "__wrapped__")
    report.check(
        "metric compute is wrapped by sync_all_reduce",
        wrapped,
        f"__wrapped__ {'present' if wrapped else 'missing'}",
    )
    metric.reset()
    kinds = {name: type(getattr(metric, name, None)).__name__ for name in METRIC_STATE}
    report.check(
        "metric state attributes are tensors after reset()",
        all(kind == "Tensor" for kind in kinds.values()),
        kinds,
    )
    # Row 0's top two are classes 0 and 1 (label 1: a hit); row 1's are 2 and 1 (label 0: a miss).
    output = {
        "y_pred": {"logits": torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])},
        "target": {"targets": {"labels": torch.tensor([1, 0])}},
    }
    engine = Engine(lambda _engine, _batch: output)
    metric.attach(engine, "top2")
    value = engine.run([0], max_epochs=1).metrics["top2"]
    report.check("metric top2 of a known batch == 0.5", value == 0.5, value)


class CountingTransform:
    """Counts its calls, so a check can see which split applied it."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return x


def check_dataset(report):
    """The dataset applies the shared transform to the train split only."""
    get_ds = entry("dataset", "get_ds")
    calls = {}
    for split in ("train", "valid", "probe"):
        transform = CountingTransform()
        loader, info = get_ds({"split": split, "n": 8, "bs": 4}, transform=transform)
        for _ in loader:
            pass
        calls[split] = transform.calls
        report.check(f"dataset info for {split}", info == {"length": 8, "num_classes": 10}, info)
    report.check(
        "dataset augments train only",
        calls == {"train": 8, "valid": 0, "probe": 0},
        f"transform calls per split {calls}",
    )


def check_sampler(report):
    """The sampler balances a 9:1 imbalance, and falls back to iterating a label-less dataset."""
    get_sampler = entry("sampler", "get_sampler")
    labels = torch.tensor([0] * 90 + [1] * 10)
    # A TensorDataset has no `labels` attribute, so this also exercises the fallback.
    dataset = TensorDataset(torch.zeros(100, 1), labels)
    sampler = get_sampler(dataset, num_samples=2000, generator=torch.Generator().manual_seed(0))
    drawn = labels[list(sampler)]
    share = float((drawn == 1).float().mean())
    report.check("sampler draws the 10% class about half the time", 0.45 < share < 0.55, share)


def check_collate(report):
    """The collate works by dotted path, with its params and with its own defaults."""
    samples = [(torch.tensor([5]), 0), (torch.tensor([5, 6]), 1), (torch.tensor([5, 6, 7]), 2)]
    for params, pad in (({"params": {"pad_id": -1}}, -1), ({}, 0)):
        collate = {"cls_name": f"{PACKAGE}.collate", **params}
        batch = next(iter(build_dataloader(samples, {"bs": 3, "collate_fn": collate})))
        expected = torch.tensor([[5, pad, pad], [5, 6, pad], [5, 6, 7]])
        ok = (
            sorted(batch) == ["lengths", "x", "y"]
            and torch.equal(batch["x"], expected)
            and batch["lengths"].tolist() == [1, 2, 3]
            and batch["y"].tolist() == [0, 1, 2]
        )
        label = "with params" if params else "without params"
        report.check(f"collate by dotted path {label} pads with {pad}", ok, batch["x"].tolist())


def check_backend(report):
    """The backend is the only sink built from ["pbar", <module>] and writes the CSV of 8.3."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = base_config()
        cfg.name = "custom"
        cfg.save_dir = tmp
        cfg.logger_name = ["pbar", f"{PACKAGE}.backend"]
        callback = LoggingCallback(cfg).start()
        report.check(
            "logger_name builds exactly one backend",
            len(callback.backends) == 1,
            [type(b).__module__ for b in callback.backends],
        )
        callback._log({"train/loss": 0.5}, step=1, epoch=1)
        callback.finish()
        path = Path(tmp) / "custom_metrics.csv"
        rows = list(csv.DictReader(path.open(newline=""))) if path.is_file() else []
        ok = len(rows) == 1 and rows[0].get("train/loss") == "0.5" and rows[0].get("epoch") == "1"
        report.check("backend CSV holds one row with train/loss 0.5, epoch 1", ok, rows)


def train(cfg):
    """Fit the config in this process; returns the trained task and the per-epoch metrics."""
    save_dir = Path(cfg.save_dir)
    if save_dir.exists():
        print(f"removing the previous run in {save_dir}")
        shutil.rmtree(save_dir)
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    task = trainer_cls(0, cfg).setup()
    history = {"trainer": [], "evaluator": [], "probe": []}
    for key, records in history.items():
        engine = task.engines.get(key)
        if engine is None:
            continue
        event = Events.EPOCH_COMPLETED if key == "trainer" else Events.COMPLETED
        engine.add_event_handler(event, lambda e, out=records: out.append(dict(e.state.metrics)))
    task.fit()
    return task, history


def check_training(report, save_dir=None):
    """Every template trained together for two epochs; the section's numbers afterwards."""
    cfg = load_config_from_file(str(CONFIG))
    if save_dir is not None:
        cfg.save_dir = str(save_dir)
    check_dispatch(cfg)
    report.check("templates_v0 dotted paths resolve", True, "check_dispatch passed")
    task, history = train(cfg)
    epochs = int(cfg.max_epochs)
    train_metrics = history["trainer"][-1] if history["trainer"] else {}
    valid = history["evaluator"][-1] if history["evaluator"] else {}
    probe = history["probe"][-1] if history["probe"] else {}
    report.check(
        f"trained {epochs} epochs", len(history["trainer"]) == epochs, len(history["trainer"])
    )
    top2 = valid.get("valid/top2")
    report.check("0 < valid/top2 <= 1", top2 is not None and 0 < top2 <= 1, top2)
    report.check("probe/top2 is present", "probe/top2" in probe, probe.get("probe/top2"))
    report.check(
        "train/loss_focal_avg is present",
        "train/loss_focal_avg" in train_metrics,
        train_metrics.get("train/loss_focal_avg"),
    )
    params = cfg.lr_scheduler_params
    expected = cfg.optimizer_params.lr * params.gamma ** ((epochs - 1) // params.step_every_epochs)
    lrs = [group["lr"] for group in task.optimizer.param_groups]
    report.check(
        f"final LR == {expected:g} in every param group",
        all(math.isclose(lr, expected, rel_tol=1e-9) for lr in lrs),
        lrs,
    )
    best = sorted(p.name for p in Path(cfg.save_dir).glob("valid_best_result_checkpoint_*.pt"))
    report.check("a valid_best_result_checkpoint_* scored on valid/top2 exists", bool(best), best)


def main(argv=None):
    """Run every check, print the tally; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-dir", help="train into this directory instead of the config's")
    args = parser.parse_args(argv)
    report = Report()
    checks = (
        ("entrypoints", check_entrypoints),
        ("metric", check_metric),
        ("dataset", check_dataset),
        ("sampler", check_sampler),
        ("collate", check_collate),
        ("backend", check_backend),
        ("training", lambda report: check_training(report, args.save_dir)),
    )
    for label, check in checks:
        try:
            check(report)
        except Exception as error:  # a crashing template fails its checks; the rest still run
            report.check(f"{label} checks ran", False, f"{type(error).__name__}: {error}")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
