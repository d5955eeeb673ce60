"""Verification for the classification example: data, sampler, augmentation, metrics, schedule.

Run from the repository root, either way::

    python -m examples.classification.scripts.checks
    python examples/classification/scripts/checks.py

The 13 checks need no trained run. When a run exists in ``save_dir``, its best checkpoint is
evaluated at the end for reference (not a check). Exits 0 only when every check passed.
"""

import sys
from pathlib import Path

import torch
from ignite.engine import Engine
from torch.utils.data import WeightedRandomSampler

from gatle_ignite import get_aug, get_dataset
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import import_entrypoint
from gatle_ignite.schedulers import prep_scheduler
from gatle_ignite.utils.checkpoints import find_best_checkpoint

SOURCE_ROOT = Path(__file__).resolve().parents[3]
CONFIG = SOURCE_ROOT / "examples" / "classification" / "configs" / "classification_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/classification/configs/classification_v0.py"
SAMPLER = "examples.classification.dataloaders.data_utils.balanced_sampler"

MIN_IMBALANCE = 10
SAMPLER_DRAWS = 20000
SAMPLER_TOL = 0.02
EPOCH_TOL = 0.05
MIN_AUG_CHANGE = 1e-6
AUG_DRAWS = 20
BAL_ACC_TOL = 1e-6
PEAK_TOL = 1e-9


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


def fractions(labels, num_classes):
    """Per-class fractions of ``labels``, as a list of floats."""
    counts = torch.bincount(torch.as_tensor(labels), minlength=num_classes).double()
    return (counts / counts.sum()).tolist()


def fmt(values):
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def run_metric(metric, name, output):
    """Feed one step output through ``metric`` attached to an engine, as a real run would."""
    engine = Engine(lambda _engine, batch: batch)
    metric.attach(engine, name)
    return engine.run([output]).metrics


def step_output(logits, labels):
    """A step output shaped like the framework's: ``{"y_pred": ..., "target": ...}``."""
    return {"y_pred": {"logits": logits}, "target": {"targets": {"labels": labels}}}


def check_data(report, cfg, n_classes):
    """Checks 1-2: the raw splits have the imbalance (or balance) they are meant to have."""
    raw = {k: v for k, v in cfg.train_ds_params.items() if k != "sampler_params"}
    train_dl, _ = get_dataset(cfg.train_ds_name, raw)
    counts = torch.bincount(train_dl.dataset.labels, minlength=n_classes).tolist()
    report.check(
        f"1. raw train: max class count >= {MIN_IMBALANCE} x min",
        max(counts) >= MIN_IMBALANCE * min(counts),
        f"counts {counts}, fractions {fmt(fractions(train_dl.dataset.labels, n_classes))}",
    )
    valid_dl, _ = get_dataset(cfg.valid_ds_name, cfg.valid_ds_params)
    test_dl, _ = get_dataset(cfg.test_ds_name, cfg.test_ds_params)
    valid = torch.bincount(valid_dl.dataset.labels, minlength=n_classes).tolist()
    test = torch.bincount(test_dl.dataset.labels, minlength=n_classes).tolist()
    report.check(
        f"2. valid counts all equal; test max >= {MIN_IMBALANCE} x min",
        len(set(valid)) == 1 and max(test) >= MIN_IMBALANCE * min(test),
        f"valid {valid}, test {test}",
    )
    return train_dl.dataset


def check_sampler(report, cfg, raw_train, n_classes):
    """Checks 3-6: the sampler balances the classes, and a train epoch uses the transform."""
    get_sampler = import_entrypoint(SAMPLER, "get_sampler")
    sampler = get_sampler(raw_train, num_samples=SAMPLER_DRAWS, num_classes=n_classes)
    drawn = fractions(raw_train.labels[list(sampler)], n_classes)
    report.check(
        f"3. {SAMPLER_DRAWS} sampler draws: every class within {SAMPLER_TOL} of {1 / n_classes}",
        all(abs(f - 1 / n_classes) <= SAMPLER_TOL for f in drawn),
        fmt(drawn),
    )

    aug = get_aug(cfg.aug_name, cfg.aug_params)
    train_dl, _ = get_dataset(cfg.train_ds_name, cfg.train_ds_params, aug)
    sampler_type = type(train_dl.sampler).__name__
    report.check(
        "4. the config's train loader has a WeightedRandomSampler",
        isinstance(train_dl.sampler, WeightedRandomSampler),
        sampler_type,
    )
    calls_before = aug.calls
    labels = torch.cat([label for _, label in train_dl])
    epoch = fractions(labels, n_classes)
    report.check(
        f"5. one train epoch: every class within {EPOCH_TOL} of {1 / n_classes}",
        all(abs(f - 1 / n_classes) <= EPOCH_TOL for f in epoch),
        f"{fmt(epoch)} over {len(labels)} samples",
    )
    report.check(
        "6. the transform is called once per sample of a train epoch",
        aug.calls - calls_before == len(labels) > 0,
        f"calls {calls_before} -> {aug.calls} for {len(labels)} samples",
    )
    return aug, train_dl


def check_augmentation(report, cfg, aug):
    """Checks 7-9: eval splits are never augmented, and the augmentation does change pixels."""
    valid_dl, info = get_dataset(cfg.valid_ds_name, cfg.valid_ds_params, aug)
    test_dl, _ = get_dataset(cfg.test_ds_name, cfg.test_ds_params, aug)
    calls_before = aug.calls
    seen = sum(len(label) for dl in (valid_dl, test_dl) for _, label in dl)
    report.check(
        "7. transform call count unchanged over a full valid + test pass",
        aug.calls == calls_before,
        f"calls {calls_before} -> {aug.calls} over {seen} eval samples",
    )
    image, _ = valid_dl.dataset[0]
    change = min(float((aug(image) - image).abs().max()) for _ in range(AUG_DRAWS))
    report.check(
        f"8. min over {AUG_DRAWS} draws of max|aug(x) - x| > {MIN_AUG_CHANGE}",
        change > MIN_AUG_CHANGE,
        f"{change:.4g}",
    )
    first, second = valid_dl.dataset[0][0], valid_dl.dataset[0][0]
    report.check(
        "9. the same valid index read twice gives identical tensors",
        torch.equal(first, second),
        f"max |difference| {float((first - second).abs().max()):.4g}",
    )
    return info


def check_metrics(report, cfg, info, n_classes):
    """Checks 10-11: balanced accuracy and top-2 compute what their names say."""
    bal = cfg.val_metrics.bal_acc
    per_class = import_entrypoint(bal.cls_name, "get_metric")
    labels = torch.tensor([0] * 40 + [1] * 10)
    logits = torch.zeros(len(labels), n_classes)
    logits[:, 0] = 1.0  # always predicts class 0
    metrics = run_metric(
        per_class("valid", info, **bal.params), "valid/bal_acc", step_output(logits, labels)
    )
    value = metrics["valid/bal_acc"]
    report.check(
        "10. bal_acc of an always-class-0 model on a 4:1 batch == 0.5",
        abs(value - 0.5) <= BAL_ACC_TOL,
        f"{value:.6f} (plain accuracy would be 0.8)",
    )

    top2 = cfg.val_metrics.top2
    topk = import_entrypoint(top2.cls_name, "get_metric")
    ranked = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    scores = []
    for label in (2, 1):  # ranked 3rd, then ranked 2nd
        output = step_output(ranked, torch.tensor([label]))
        scores.append(run_metric(topk("valid", info, **top2.params), "valid/top2", output))
    third, second = (s["valid/top2"] for s in scores)
    report.check(
        "11. top-2: label ranked 3rd scores 0.0, ranked 2nd scores 1.0",
        third == 0.0 and second == 1.0,
        f"3rd {third}, 2nd {second}",
    )


def check_schedule(report, cfg, train_dl):
    """Check 12: the warm-up rises to the configured lr, then cosine decays to the floor."""
    model = import_entrypoint(cfg.model_name, "Model")(**cfg.model_params)
    peak_lr = cfg.optimizer_params.lr
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr)
    engines = {"trainer": Engine(lambda _engine, batch: None)}
    scheduler, _, _ = prep_scheduler(cfg.lr_scheduler, cfg, train_dl, optimizer, engines)
    lrs = []
    for _ in range(cfg.max_epochs * len(train_dl)):
        scheduler(None)
        lrs.append(optimizer.param_groups[0]["lr"])
    peak = max(lrs)
    warmup_end = int(cfg.lr_scheduler_params.warmup_epochs * len(train_dl))
    report.check(
        "12. warmup_cosine: lr[0] < 0.5 x peak, peak == lr, lr[warmup_end - 1] == peak, "
        "last < 0.05 x peak",
        lrs[0] < 0.5 * peak
        and abs(peak - peak_lr) <= PEAK_TOL
        and lrs[warmup_end - 1] == peak
        and lrs[-1] < 0.05 * peak,
        f"lr[0] {lrs[0]:.3g}, peak {peak:.6g} (configured {peak_lr:g}), "
        f"lr[{warmup_end - 1}] {lrs[warmup_end - 1]:.6g}, last {lrs[-1]:.3g} "
        f"over {len(lrs)} steps",
    )


def check_engines(report, cfg):
    """Check 13: the trainer declares a valid and a test engine, and the tester runs in training."""
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer")
    splits = [spec.split for spec in trainer_cls(0, cfg).eval_specs()]
    report.check(
        "13. eval_specs() splits include valid and test; every_test > 0",
        {"valid", "test"} <= set(splits) and cfg.every_test > 0,
        f"splits {splits}, every_test {cfg.every_test}",
    )


def show_trained_run(cfg):
    """Not a check: what the trained run's best-on-valid checkpoint scores, if there is one."""
    if find_best_checkpoint(cfg.save_dir, prefix="valid_") is None:
        print(f"\n(no trained run in {cfg.save_dir}; to see its scores, train first:")
        print(f"   {TRAIN_COMMAND})")
        return
    print("\nfor reference, not a check: the best-on-valid checkpoint")
    cfg.run = True
    cfg.load_from_ckpt = "best"
    cfg.logger_name = []
    cfg.save_ckpt = False
    import_entrypoint(cfg.main_runner, "Trainer")(0, cfg).evaluate()


def main():
    """Run the 13 checks, print the tally; returns the exit code."""
    # Run as a file, Python puts scripts/ on sys.path instead of the source root that the
    # config's absolute imports need; the CLI adds the working directory the same way.
    if str(SOURCE_ROOT) not in sys.path:
        sys.path.insert(0, str(SOURCE_ROOT))
    cfg = load_config_from_file(str(CONFIG))
    n_classes = cfg.model_params.n_classes
    torch.manual_seed(0)
    report = Report()
    print(f"checks for {cfg.name}\n")
    raw_train = check_data(report, cfg, n_classes)
    aug, train_dl = check_sampler(report, cfg, raw_train, n_classes)
    info = check_augmentation(report, cfg, aug)
    check_metrics(report, cfg, info, n_classes)
    check_schedule(report, cfg, train_dl)
    check_engines(report, cfg)
    code = report.finish()
    show_trained_run(cfg)
    return code


if __name__ == "__main__":
    sys.exit(main())
