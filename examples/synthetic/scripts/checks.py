"""Verification for the synthetic example: train the full config in-process, then check it.

Run from the repository root::

    python -m examples.synthetic.scripts.checks             # train 15 epochs, then check
    python -m examples.synthetic.scripts.checks --no-train  # only check an existing run

Training first empties the run's ``save_dir``, so the checks see this run's files only. Exits 0
only when no check failed.
"""

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import torch
from ignite.engine import Events

from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import import_entrypoint

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "synthetic_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/synthetic/configs/synthetic_v0.py"
HISTORY_FILE = "checks_history.json"

MAX_FINAL_LOSS = 1.0
MAX_LOSS_RATIO = 0.5
MIN_VALID_ACC = 0.85
REQUIRED_KEYS = ("model", "optimizer", "trainer")
LATEST_RE = re.compile(r"^latest_epoch_checkpoint_(\d+)\.pt$")
BEST_RE = re.compile(r"^valid_best_result_checkpoint_(\d+)_(-?[\d.]+)\.pt$")


class Report:
    """Collects PASS / FAIL / SKIP lines and prints the tally."""

    def __init__(self):
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def check(self, name, ok, observed):
        self._emit("PASS" if ok else "FAIL", name, observed)

    def skip(self, name, why):
        self._emit("SKIP", name, why)

    def _emit(self, status, name, observed):
        self.counts[status] += 1
        print(f"{status}  {name}: {observed}")

    def finish(self):
        counts = self.counts
        print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
        return 1 if counts["FAIL"] else 0


def load_cfg():
    """The example's config, loaded by file path as the CLI does."""
    return load_config_from_file(str(CONFIG))


def train(cfg):
    """Fit the config in this process; return the per-epoch loss and accuracy history."""
    save_dir = Path(cfg.save_dir)
    if save_dir.exists():
        print(f"removing the previous run in {save_dir}")
        shutil.rmtree(save_dir)
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    task = trainer_cls(0, cfg).setup()
    evaluator = task.engines.get("evaluator")
    if evaluator is None:
        raise RuntimeError("the config builds no evaluator, so valid/acc cannot be checked")

    history = {"train/loss_avg": [], "valid/acc": []}

    def record_loss(engine):
        history["train/loss_avg"].append(float(engine.state.metrics["train/loss_avg"]))

    def record_acc(engine):
        history["valid/acc"].append(float(engine.state.metrics["valid/acc"]))

    task.engines["trainer"].add_event_handler(Events.EPOCH_COMPLETED, record_loss)
    evaluator.add_event_handler(Events.COMPLETED, record_acc)
    task.fit()

    save_dir.mkdir(parents=True, exist_ok=True)
    (save_dir / HISTORY_FILE).write_text(json.dumps(history, indent=1))
    return history


def evaluate_latest(cfg):
    """valid/acc of the latest checkpoint, through the framework's inference mode."""
    cfg.run = True
    cfg.load_from_ckpt = "latest"
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    return float(trainer_cls(0, cfg).evaluate()["valid/acc"])


def find(save_dir, pattern):
    """Sorted names in ``save_dir`` matching ``pattern``."""
    if not save_dir.is_dir():
        return []
    return sorted(p.name for p in save_dir.iterdir() if pattern.match(p.name))


def newest(save_dir, pattern):
    """The most recently written file in ``save_dir`` matching ``pattern`` (what resume uses)."""
    paths = [save_dir / name for name in find(save_dir, pattern)]
    return max(paths, key=lambda path: path.stat().st_mtime) if paths else None


def load_history(save_dir):
    """The history this script saved for the run in ``save_dir``: ``(history, why_not)``."""
    path = save_dir / HISTORY_FILE
    if not path.is_file():
        return (
            None,
            "no loss history (the run was not made by this script; rerun without --no-train)",
        )
    if path.stat().st_mtime < newest(save_dir, LATEST_RE).stat().st_mtime:
        return (
            None,
            "the loss history is older than the newest checkpoint (rerun without --no-train)",
        )
    return json.loads(path.read_text()), None


def check_history(report, history, max_epochs):
    """The loss and accuracy checks on a recorded history."""
    losses = history["train/loss_avg"]
    accs = history["valid/acc"]
    report.check(f"epochs trained == {max_epochs}", len(losses) == max_epochs, len(losses))
    if not losses:
        report.check("train/loss_avg recorded", False, "no epoch completed")
        return
    first, last = losses[0], losses[-1]
    print(f"       epoch 1: train/loss_avg {first:.3f}", end="")
    print(f", valid/acc {accs[0]:.3f}" if accs else "")
    print(f"       epoch {len(losses)}: train/loss_avg {last:.3f}", end="")
    print(f", valid/acc {accs[-1]:.3f}" if accs else "")
    report.check(
        f"final-epoch train/loss_avg < {MAX_FINAL_LOSS}", last < MAX_FINAL_LOSS, f"{last:.4f}"
    )
    report.check(
        f"final loss < {MAX_LOSS_RATIO} x epoch-1 loss",
        last < MAX_LOSS_RATIO * first,
        f"{last:.4f} vs {MAX_LOSS_RATIO} x {first:.4f} = {MAX_LOSS_RATIO * first:.4f}",
    )


def check_checkpoints(report, save_dir, max_epochs):
    """The latest and best files exist and each holds the required keys."""
    latest = find(save_dir, LATEST_RE)
    best = find(save_dir, BEST_RE)
    report.check("latest_epoch_checkpoint_* exists", bool(latest), latest or "none")
    report.check("valid_best_result_checkpoint_* exists", bool(best), best or "none")
    if latest:
        path = newest(save_dir, LATEST_RE)
        epoch = int(LATEST_RE.match(path.name).group(1))
        report.check(
            f"newest latest checkpoint is epoch {max_epochs}", epoch == max_epochs, path.name
        )
    for name in latest + best:
        try:
            state = torch.load(save_dir / name, map_location="cpu", weights_only=True)
        except Exception as error:  # any load failure is a failed check, not a crash
            report.check(f"{name} loads with weights_only=True", False, repr(error))
            continue
        missing = [key for key in REQUIRED_KEYS if key not in state]
        report.check(
            f"{name} holds {', '.join(REQUIRED_KEYS)}",
            not missing,
            f"missing {missing}" if missing else f"keys {sorted(state)}",
        )


def main(argv=None):
    """Train (unless ``--no-train``), run every check, print the tally; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-train", action="store_true", help="only check an existing run")
    args = parser.parse_args(argv)

    cfg = load_cfg()
    save_dir = Path(cfg.save_dir)
    max_epochs = int(cfg.max_epochs)

    if args.no_train:
        if not find(save_dir, LATEST_RE):
            print(f"no latest_epoch_checkpoint_*.pt in {save_dir}.")
            print(f"  Train first: {TRAIN_COMMAND}")
            print("  (or run this script without --no-train, which trains and then checks)")
            return 1
        history, why = load_history(save_dir)
    else:
        history, why = train(cfg), None

    if args.no_train:
        # An existing run's files are the truth: evaluate its latest checkpoint.
        final_acc = evaluate_latest(load_cfg())
    else:
        final_acc = history["valid/acc"][-1] if history["valid/acc"] else None

    report = Report()
    print(f"\nchecks for {cfg.name} in {save_dir}")
    if history is not None:
        check_history(report, history, max_epochs)
    else:
        report.skip(f"final-epoch train/loss_avg < {MAX_FINAL_LOSS}", why)
        report.skip(f"final loss < {MAX_LOSS_RATIO} x epoch-1 loss", why)
    acc_name = f"final valid/acc > {MIN_VALID_ACC}"
    if final_acc is None:
        report.check(acc_name, False, "no evaluation ran")
    else:
        report.check(acc_name, final_acc > MIN_VALID_ACC, f"{final_acc:.4f}")
    check_checkpoints(report, save_dir, max_epochs)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
