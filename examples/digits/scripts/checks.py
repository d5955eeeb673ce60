"""Verification for the digits example: the split, the augmentation, and the trained checkpoint.

Train first, then run from the repository root, either way::

    gatle-ignite train --config=examples/digits/configs/digits_v0.py
    python -m examples.digits.scripts.checks
    python examples/digits/scripts/checks.py

Exits 0 only when every check passed.
"""

import sys
from pathlib import Path

import torch

from gatle_ignite import get_aug, get_dataset
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import import_entrypoint
from gatle_ignite.utils.checkpoints import find_best_checkpoint

SOURCE_ROOT = Path(__file__).resolve().parents[3]
CONFIG = SOURCE_ROOT / "examples" / "digits" / "configs" / "digits_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/digits/configs/digits_v0.py"

N_IMAGES = 1797
N_TRAIN = 1437
N_HELD_OUT = 360
NUM_CLASSES = 10
AUG_DRAWS = 20
MIN_AUG_CHANGE = 1e-6
MIN_TRAINED_ACC = 0.90
MAX_UNTRAINED_ACC = 0.25


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


def in_process(ds_params):
    """``ds_params`` with no DataLoader workers: a worker's transform counts its calls in its own
    copy, so the counter in this process would stay at 0."""
    return {**ds_params, "num_workers": 0}


def check_split(report, cfg, aug):
    """Checks 1-2: train and held-out are disjoint, cover everything, and share every class."""
    train = get_dataset(cfg.train_ds_name, in_process(cfg.train_ds_params))[0].dataset
    # With the transform, as the trainer builds it, so augmented eval data would differ.
    held_out = get_dataset(cfg.test_ds_name, in_process(cfg.test_ds_params), aug)[0].dataset
    train_idx, held_idx = set(train.indices.tolist()), set(held_out.indices.tolist())
    overlap = len(train_idx & held_idx)
    report.check(
        f"1a. train and held-out are disjoint and cover all {N_IMAGES} ({N_TRAIN} + {N_HELD_OUT})",
        overlap == 0
        and train_idx | held_idx == set(range(N_IMAGES))
        and (len(train), len(held_out)) == (N_TRAIN, N_HELD_OUT),
        f"{len(train)} + {len(held_out)}, {overlap} shared, "
        f"{len(train_idx | held_idx)} distinct of {N_IMAGES}",
    )
    first, second = held_out[0][0], held_out[0][0]
    report.check(
        "1b. the same held-out index read twice gives identical tensors",
        torch.equal(first, second),
        f"max |difference| {float((first - second).abs().max()):.4g}",
    )
    train_classes = torch.bincount(train.labels, minlength=NUM_CLASSES)
    held_classes = torch.bincount(held_out.labels, minlength=NUM_CLASSES)
    report.check(
        f"2. all {NUM_CLASSES} classes appear in both splits",
        bool((train_classes > 0).all() and (held_classes > 0).all()),
        f"train {train_classes.tolist()}, held-out {held_classes.tolist()}",
    )


def check_augmentation(report, cfg, aug):
    """Check 3: the transform runs on train batches only, and it changes pixels."""
    train_dl, _ = get_dataset(cfg.train_ds_name, in_process(cfg.train_ds_params), aug)
    calls_before = aug.calls
    seen = sum(len(label) for _, label in train_dl)
    report.check(
        "3a. the transform is called once per sample of a train epoch",
        aug.calls - calls_before == seen > 0,
        f"calls {calls_before} -> {aug.calls} for {seen} samples",
    )
    calls_before = aug.calls
    evaluated = 0
    for field in ("valid", "test"):
        dl, _ = get_dataset(cfg[f"{field}_ds_name"], in_process(cfg[f"{field}_ds_params"]), aug)
        evaluated += sum(len(label) for _, label in dl)
    report.check(
        "3b. transform call count unchanged over a full valid + test pass",
        aug.calls == calls_before,
        f"calls {calls_before} -> {aug.calls} over {evaluated} eval samples",
    )
    image = train_dl.dataset.images[0]
    change = min(float((aug(image) - image).abs().max()) for _ in range(AUG_DRAWS))
    report.check(
        f"3c. min over {AUG_DRAWS} draws of max|aug(x) - x| > {MIN_AUG_CHANGE}",
        change > MIN_AUG_CHANGE,
        f"{change:.4g}",
    )


def inference_cfg():
    """The config in inference mode: load the best checkpoint, log and write nothing."""
    cfg = load_config_from_file(str(CONFIG))
    cfg.run = True
    cfg.load_from_ckpt = "best"
    cfg.logger_name = []
    cfg.save_ckpt = False
    return cfg


def check_trained(report, cfg):
    """Checks 4-5: the best checkpoint has learned; the same model untrained has not."""
    best = find_best_checkpoint(cfg.save_dir, prefix="valid_")
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer")
    scores = trainer_cls(0, inference_cfg()).evaluate() if best is not None else {}
    for label, key in (("4a", "test/acc"), ("4b", "valid/acc")):
        name = f"{label}. best checkpoint {key} > {MIN_TRAINED_ACC}"
        if best is None:
            report.check(name, False, f"no valid_best_result_* checkpoint in {cfg.save_dir}")
            continue
        value = float(scores[key])
        report.check(name, value > MIN_TRAINED_ACC, f"{value:.4f} ({Path(best).name})")
    if best is None:
        print(f"      Train first: {TRAIN_COMMAND}")
    untrained = float(trainer_cls(0, inference_cfg()).evaluate(load_checkpoint=False)["test/acc"])
    report.check(
        f"5. untrained control test/acc < {MAX_UNTRAINED_ACC} (chance 0.10)",
        untrained < MAX_UNTRAINED_ACC,
        f"{untrained:.4f}",
    )


def check_engines(report, cfg):
    """Check 6: the tester exists and runs during training."""
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer")
    splits = [spec.split for spec in trainer_cls(0, cfg).eval_specs()]
    report.check(
        "6. eval_specs() includes the test split; every_test > 0",
        "test" in splits and cfg.every_test > 0,
        f"splits {splits}, every_test {cfg.every_test}",
    )


def main():
    """Run every check, print the tally; returns the exit code."""
    # Run as a file, Python puts scripts/ on sys.path instead of the source root that the
    # config's absolute imports need; the CLI adds the working directory the same way.
    if str(SOURCE_ROOT) not in sys.path:
        sys.path.insert(0, str(SOURCE_ROOT))
    cfg = load_config_from_file(str(CONFIG))
    torch.manual_seed(0)
    report = Report()
    print(f"checks for {cfg.name} in {cfg.save_dir}\n")
    aug = get_aug(cfg.aug_name, cfg.aug_params)
    check_split(report, cfg, aug)
    check_augmentation(report, cfg, aug)
    check_trained(report, cfg)
    check_engines(report, cfg)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
