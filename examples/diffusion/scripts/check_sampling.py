"""Does the trained DDPM sample the ring? Compare its samples with real data, noise and no training.

Run from the repository root, after training::

    python -m examples.diffusion.scripts.check_sampling
    python examples/diffusion/scripts/check_sampling.py   # the same

The untrained model and the best checkpoint both go through the framework's inference mode
(``evaluate``, which runs the trainer's sampling ``eval_step``). Two independent real draws give
the floor and N(0, I) the prior, scored with the same metric class. Exits 0 only when every
check passes.
"""

import sys
from pathlib import Path

import torch

from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import import_entrypoint, import_module_from_path
from gatle_ignite.utils.checkpoints import find_best_checkpoint

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "diffusion_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/diffusion/configs/diffusion_v0.py"
METRICS = "examples.diffusion.metrics.ring_stats"
REFERENCE_SEED = 1
RATIO = 0.5


def importable_from_cwd():
    """Run by path, python puts ``scripts/`` on sys.path, not the root the dotted paths need."""
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def eval_cfg():
    """The run's config in inference mode, with no logging."""
    cfg = load_config_from_file(str(CONFIG))
    cfg.run = True
    cfg.logger_name = []
    return cfg


def evaluate(load_checkpoint):
    """``(valid metrics without the prefix, trainer)`` of the untrained or best model."""
    cfg = eval_cfg()
    trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")(0, cfg)
    metrics = trainer.evaluate(load_checkpoint=load_checkpoint)
    return {key.split("/", 1)[1]: value for key, value in metrics.items()}, trainer


def score(samples, real, centers, stats):
    """Every statistic of ``samples`` against ``real`` through the metric class."""
    results = {}
    for stat in stats.STATS:
        metric = stats.RingDistributionStats(centers, stat)
        metric.reset()
        metric.update((samples, real))
        results[stat] = metric.compute()
    return results


def main():
    """Score the four sources, print each check and the tally; returns the exit code."""
    importable_from_cwd()
    cfg = eval_cfg()
    if find_best_checkpoint(cfg.save_dir, prefix="valid_") is None:
        print(f"no valid_best_result_checkpoint_*.pt in {cfg.save_dir}.")
        print(f"  Train first: {TRAIN_COMMAND}")
        return 1

    untrained, _ = evaluate(load_checkpoint=False)
    trained, trainer = evaluate(load_checkpoint=True)

    info = trainer.infos["valid"]
    stats = import_module_from_path(METRICS)
    ring = import_module_from_path(cfg.valid_ds_name)
    gen = torch.Generator().manual_seed(REFERENCE_SEED)
    n = info["length"]

    def draw():
        return ring.sample_ring(n, gen, info["n_modes"], info["radius"], info["std"])

    real_a, real_b = draw(), draw()
    floor = score(real_a, real_b, info["mode_centers"], stats)
    prior = score(torch.randn(n, 2, generator=gen), real_b, info["mode_centers"], stats)

    print(f"\n{'':18}" + "".join(f"{stat:>14}" for stat in stats.STATS))
    for label, row in (
        ("real vs real", floor),
        ("prior N(0, I)", prior),
        ("untrained", untrained),
        ("trained", trained),
    ):
        print(f"{label:18}" + "".join(f"{row[stat]:14.5g}" for stat in stats.STATS))
    print()

    checks = [
        ("mode_tv", "untrained", untrained),
        ("mode_dist", "untrained", untrained),
        ("mode_dist", "prior", prior),
        ("radius_error", "prior", prior),
    ]
    failed = 0
    for stat, label, row in checks:
        ok = trained[stat] < RATIO * row[stat]
        failed += not ok
        print(
            f"{'PASS' if ok else 'FAIL'}  trained {stat} < {RATIO} x {label}: "
            f"{trained[stat]:.4f} vs {RATIO} x {row[stat]:.4f} = {RATIO * row[stat]:.4f}"
        )
    print(f"\n{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
