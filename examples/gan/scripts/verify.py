"""Verification for the gan example: the trained generator must beat its own initial weights.

Run from the repository root, after training (either form)::

    gatle-ignite train --config=examples/gan/configs/gan_v0.py
    python -m examples.gan.scripts.verify
    python examples/gan/scripts/verify.py

It scores the generator through the framework's inference mode twice, with the seed-initialised
weights and with the best checkpoint, against a floor: the sliced Wasserstein distance between
two independent real draws. Exits 0 only when every check passed.
"""

# ruff: noqa: E402
import sys
from pathlib import Path

# Run by file path, python puts this folder on sys.path, not the source root holding `examples`.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from examples.gan.dataloaders.gaussian_2d import sample_real
from examples.gan.metrics.distribution import moment_distance, sliced_wasserstein
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import import_entrypoint
from gatle_ignite.utils.checkpoints import find_best_checkpoint

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "gan_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/gan/configs/gan_v0.py"
# The valid split's draw, and an independent one for the floor.
VALID_N, VALID_SEED, FLOOR_SEED = 4096, 99, 1234
MIN_IMPROVEMENT = 5.0
MAX_FLOOR_MULTIPLE = 12.0


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


def score(load_checkpoint):
    """valid/swd and valid/moments through ``Trainer(0, cfg).evaluate()``, with no prior setup."""
    cfg = load_config_from_file(str(CONFIG))
    cfg.run = True
    cfg.load_from_ckpt = "best"
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    # cfg.seed fixes the initial weights, so the untrained run is the one training started from.
    metrics = trainer_cls(0, cfg).evaluate(load_checkpoint=load_checkpoint)
    return float(metrics["valid/swd"]), float(metrics["valid/moments"])


def main():
    cfg = load_config_from_file(str(CONFIG))
    best = find_best_checkpoint(cfg.save_dir, prefix="valid_")
    if best is None:
        print(f"no valid_best_result_checkpoint_*.pt in {cfg.save_dir}.")
        print(f"  Train first: {TRAIN_COMMAND}")
        return 1

    real_a = sample_real(VALID_N, VALID_SEED)
    real_b = sample_real(VALID_N, FLOOR_SEED)
    floor = sliced_wasserstein(real_a, real_b)
    floor_moments = moment_distance(real_a, real_b)
    print("untrained generator (seed-initialised weights):")
    untrained, untrained_moments = score(load_checkpoint=False)
    print(f"trained generator ({best.name}):")
    trained, trained_moments = score(load_checkpoint=True)

    print()
    print(f"{'':>22}{'swd':>10}{'moments':>10}")
    print(f"{'real vs real (floor)':>22}{floor:>10.4f}{floor_moments:>10.4f}")
    print(f"{'untrained':>22}{untrained:>10.4f}{untrained_moments:>10.4f}")
    print(f"{'trained (best)':>22}{trained:>10.4f}{trained_moments:>10.4f}")
    print()

    report = Report()
    # A zero distance is a broken metric, not a perfect generator: nan fails the check.
    improvement = untrained / trained if trained > 0 else float("nan")
    report.check(
        f"untrained swd / trained swd > {MIN_IMPROVEMENT}",
        improvement > MIN_IMPROVEMENT,
        f"{untrained:.4f} / {trained:.4f} = {improvement:.2f}",
    )
    multiple = trained / floor
    report.check(
        f"trained swd / floor < {MAX_FLOOR_MULTIPLE}",
        multiple < MAX_FLOOR_MULTIPLE,
        f"{trained:.4f} / {floor:.4f} = {multiple:.2f}",
    )
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
