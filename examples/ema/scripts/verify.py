"""Verification for the ema example: a short run, then 13 checks of how the EMA is wired in.

Run from the repository root (either form)::

    python -m examples.ema.scripts.verify
    python examples/ema/scripts/verify.py
    python -m examples.ema.scripts.verify --override accum_steps=2   # the EMA honours `step`

It wipes ``examples/ema/checkpoints/verify``, trains 2 epochs of 30 iterations there, and checks
the shadow's updates (1x), what each eval engine sees (2x), that the live weights come back (3x)
and that the EMA travels through save, resume and the best file (4x). It then reports the full
run's EMA-vs-live accuracy (not a check) if that run has been trained. Exits 0 only when
every check passed.
"""

# ruff: noqa: E402
import argparse
import shutil
import sys
from pathlib import Path

# Run by file path, python puts this folder on sys.path, not the source root holding `examples`.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from ignite.engine import Events

from examples.ema.configs.base_utils import ckpt_dir
from gatle_ignite.config.loader import apply_overrides, load_config_from_file
from gatle_ignite.dispatch import import_entrypoint
from gatle_ignite.trainer.checkpointing import load_checkpoints
from gatle_ignite.utils.checkpoints import find_best_checkpoint, find_latest_checkpoint

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ema_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/ema/configs/ema_v0.py"
MAX_EPOCHS = 2
TRAIN_LENGTH = 30
CHECK_4B = "4b saved ema.shadow differs from saved model"
CHECK_4C = "4c resume restores the shadow (fresh != saved, loaded == saved != live)"
CHECK_4D = "4d restored num_updates == saved and > 0"
# Smallest difference that counts as "different"; "the same" means exactly 0.0.
MIN_DIFF = 1e-6


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


def load_cfg(overrides):
    cfg = load_config_from_file(str(CONFIG))
    return apply_overrides(cfg, overrides)


def build_trainer(cfg):
    return import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")(0, cfg)


def verify_cfg(overrides, resume=False):
    """The example's config, shortened and pointed at the scratch ``verify`` directory."""
    cfg = load_cfg(overrides)
    cfg.max_epochs = MAX_EPOCHS
    cfg.train_length = TRAIN_LENGTH
    cfg.save_dir = ckpt_dir("verify")
    cfg.resume = resume
    return cfg


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a, b, floats_only=False):
    """max |a - b| over the tensors of two state dicts with the same keys.

    "Differs" checks pass ``floats_only``: BatchNorm's step counter changes on every batch, so
    counting it would let a shadow whose weights never move look as if it had.
    """
    keys = [k for k in a if a[k].is_floating_point() or not floats_only]
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in keys)


def check_updates(report, task, initial_shadow):
    """1x: the shadow is a separate copy that the optimizer steps move."""
    shadow = task.ema.shadow
    gap = max_diff(shadow, snapshot(task.model), floats_only=True)
    report.check(f"1a max|shadow - live| > {MIN_DIFF}", gap > MIN_DIFF, f"{gap:.4f}")

    live = task.model.state_dict()
    before = {k: v.clone() for k, v in shadow.items()}
    moved = 0.0
    for tensor in live.values():
        keep = tensor.clone()
        tensor.add_(1000)
        moved = max(moved, max_diff(shadow, before))
        tensor.copy_(keep)
    shared = sorted(k for k in live if live[k].data_ptr() == shadow[k].data_ptr())
    report.check(
        "1b +1000 on each live tensor leaves the shadow alone; no shared storage",
        moved == 0.0 and not shared,
        f"shadow moved {moved}, tensors sharing a data_ptr: {shared or 'none'}",
    )

    expected = MAX_EPOCHS * TRAIN_LENGTH // task.accum_steps
    drift = max_diff(shadow, initial_shadow, floats_only=True)
    report.check(
        f"1c num_updates == {MAX_EPOCHS} x {TRAIN_LENGTH} // accum_steps {task.accum_steps}"
        f" == {expected}, and the shadow moved",
        task.ema.num_updates == expected and drift > MIN_DIFF,
        f"num_updates {task.ema.num_updates}, moved {drift:.4f} from its initial value",
    )


def check_eval_swap(report, task):
    """2x and 3x: the valid engine sees the shadow, raw sees live, and live comes back."""
    live_before = snapshot(task.model)
    seen = {}

    def recorder(key):
        def record(engine):
            seen[key] = snapshot(task.model)

        return record

    for key in ("evaluator", "raw"):
        task.engines[key].add_event_handler(Events.STARTED, recorder(key))
    for spec in task.eval_specs():
        task.run_eval_engine(spec)

    if "evaluator" in seen:
        to_shadow = max_diff(seen["evaluator"], task.ema.shadow)
        to_live = max_diff(seen["evaluator"], live_before, floats_only=True)
        report.check(
            "2a valid engine saw exactly the shadow, not live",
            to_shadow == 0.0 and to_live > MIN_DIFF,
            f"vs shadow {to_shadow}, vs live {to_live:.4f}",
        )
    else:
        report.check("2a valid engine saw exactly the shadow, not live", False, "it never ran")
    if "raw" in seen:
        to_live = max_diff(seen["raw"], live_before)
        report.check("2b raw engine saw exactly the live weights", to_live == 0.0, f"{to_live}")
    else:
        report.check("2b raw engine saw exactly the live weights", False, "it never ran")

    valid_acc = task.engines["evaluator"].state.metrics.get("valid/acc")
    raw_acc = task.engines["raw"].state.metrics.get("raw/acc")
    report.check(
        "2c valid/acc (EMA) != raw/acc (live)",
        valid_acc is not None and raw_acc is not None and valid_acc != raw_acc,
        f"valid/acc {valid_acc}, raw/acc {raw_acc}",
    )

    after = max_diff(snapshot(task.model), live_before)
    report.check("3a live weights unchanged by evaluation", after == 0.0, f"{after}")

    valid_spec = next(spec for spec in task.eval_specs() if spec.key == "evaluator")
    inside, propagated = None, False
    try:
        with type(task).eval_context(task, valid_spec):
            inside = max_diff(snapshot(task.model), task.ema.shadow)
            raise RuntimeError("raised inside eval_context")
    except RuntimeError:
        propagated = True
    after = max_diff(snapshot(task.model), live_before)
    report.check(
        "3b an exception inside eval_context still restores the live weights",
        inside == 0.0 and after == 0.0 and propagated,
        f"inside vs shadow {inside}, after vs live {after}, exception propagated {propagated}",
    )


def check_checkpoints(report, overrides, save_dir):
    """4x: the EMA is saved, restored on resume, and the best file keeps the live weights."""
    latest = find_latest_checkpoint(save_dir)
    state = torch.load(latest, map_location="cpu", weights_only=False) if latest else {}
    report.check(
        "4a newest latest checkpoint has 'ema'",
        "ema" in state,
        f"{latest.name}: keys {sorted(state)}" if latest else f"no latest_epoch* in {save_dir}",
    )
    if "ema" in state:
        check_resume(report, overrides, state)
    else:
        for name in (CHECK_4B, CHECK_4C, CHECK_4D):
            report.check(name, False, "not checked: the latest checkpoint has no 'ema'")

    name = "4e best checkpoint's model (live) differs from its ema.shadow"
    best = find_best_checkpoint(save_dir, prefix="valid_")
    best_state = torch.load(best, map_location="cpu", weights_only=False) if best else {}
    if "ema" not in best_state:
        why = f"{best.name} has no 'ema'" if best else f"no valid_best_result* in {save_dir}"
        report.check(name, False, why)
        return
    gap = max_diff(best_state["model"], best_state["ema"]["shadow"], floats_only=True)
    report.check(name, gap > MIN_DIFF, f"{best.name}: {gap:.4f}")


def check_resume(report, overrides, state):
    """4b-4d on the latest checkpoint's state and a fresh trainer resumed from it."""
    saved = state["ema"]
    gap = max_diff(saved["shadow"], state["model"], floats_only=True)
    report.check(CHECK_4B, gap > MIN_DIFF, f"{gap:.4f}")

    resumed = build_trainer(verify_cfg(overrides, resume=True)).setup()
    fresh_gap = max_diff(resumed.ema.shadow, saved["shadow"], floats_only=True)
    load_checkpoints(resumed)
    loaded_gap = max_diff(resumed.ema.shadow, saved["shadow"])
    live_gap = max_diff(resumed.ema.shadow, snapshot(resumed.model), floats_only=True)
    resumed.teardown()
    report.check(
        CHECK_4C,
        fresh_gap > MIN_DIFF and loaded_gap == 0.0 and live_gap > MIN_DIFF,
        f"fresh vs saved {fresh_gap:.4f}, loaded vs saved {loaded_gap}, loaded vs live "
        f"{live_gap:.4f}",
    )
    restored = resumed.ema.num_updates
    report.check(
        CHECK_4D,
        restored == saved["num_updates"] and restored > 0,
        f"restored {restored}, saved {saved['num_updates']}",
    )


def report_full_run(overrides):
    """Not a check: the trained run's EMA and live accuracy, from its best checkpoint."""
    cfg = load_cfg(overrides)
    if find_best_checkpoint(cfg.save_dir, prefix="valid_") is None:
        print(f"\nno full run in {cfg.save_dir}; to see its EMA-vs-live numbers, train first:")
        print(f"  {TRAIN_COMMAND}")
        return
    cfg.run = True
    cfg.load_from_ckpt = "best"
    print(f"\nfull run ({cfg.save_dir}), best checkpoint:")
    metrics = build_trainer(cfg).evaluate()
    gap = 100 * (metrics["valid/acc"] - metrics["raw/acc"])
    print(f"EMA minus live: {gap:+.1f} points")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--override", action="append", default=[], metavar="K=V", help="as for gatle-ignite"
    )
    args = parser.parse_args(argv)

    cfg = verify_cfg(args.override)
    save_dir = Path(cfg.save_dir)
    if save_dir.exists():
        print(f"removing the previous verify run in {save_dir}")
        shutil.rmtree(save_dir)

    torch.manual_seed(0)
    task = build_trainer(cfg)
    # fit() calls setup() again; it must be a no-op, or the snapshot below is of another EMA.
    task.setup()
    initial_shadow = {k: v.clone() for k, v in task.ema.shadow.items()}
    task.fit()

    report = Report()
    print(f"\nchecks for {cfg.name} in {save_dir}")
    check_updates(report, task, initial_shadow)
    check_eval_swap(report, task)
    check_checkpoints(report, args.override, save_dir)
    report_full_run(args.override)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
