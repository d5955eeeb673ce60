"""Did the contrastive run learn anything? Compare its kNN probe with two controls.

Run from the repository root, after training::

    python -m examples.contrastive.scripts.probe_check
    python examples/contrastive/scripts/probe_check.py   # the same

The trained encoder's ``valid/knn`` must beat, by ``MARGIN``, both the raw inputs (bank view 1
against query view 1, through the same metric class) and an untrained encoder. Exits 0 and
prints ``LEARNED`` only when every check passes, else ``NO EVIDENCE`` and exits 1.
"""

import sys
import tempfile
from pathlib import Path

import torch

from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import import_entrypoint
from gatle_ignite.utils.checkpoints import find_best_checkpoint

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "contrastive_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/contrastive/configs/contrastive_v0.py"
CONTROL_NAME = "valid_best_result_checkpoint_0_0.0000.pt"
FIRST_WEIGHT = "encoder.0.weight"
MARGIN = 0.05


def importable_from_cwd():
    """Run by path, python puts ``scripts/`` on sys.path, not the root the dotted paths need."""
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def eval_cfg(save_dir):
    """The run's config in inference mode, loading the best checkpoint found in ``save_dir``."""
    cfg = load_config_from_file(str(CONFIG))
    cfg.run = True
    cfg.load_from_ckpt = "best"
    cfg.save_ckpt = False
    cfg.logger_name = []
    cfg.save_dir = str(save_dir)
    return cfg


def probe(save_dir):
    """``(valid/knn, trainer)`` for the best checkpoint in ``save_dir``."""
    cfg = eval_cfg(save_dir)
    trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")(0, cfg).setup()
    return float(trainer.evaluate()["valid/knn"]), trainer


def raw_baseline(trainer, metric_cls):
    """kNN accuracy of raw inputs: bank view 1 against validation view 1."""
    bank = [(view1, labels) for view1, _, labels in trainer.bank_dl]
    knn = trainer.cfg.knn_params
    metric = metric_cls(
        lambda: (torch.cat([v for v, _ in bank]), torch.cat([y for _, y in bank])),
        k=knn["k"],
        temperature=knn["temperature"],
    )
    metric.reset()
    for view1, _, labels in trainer.dls["valid"]:
        metric.update((view1, labels))
    return metric.compute()


def untrained_control(best, cfg, directory):
    """Write the trained file with a fresh init in place of its model into ``directory``.

    Inference mode loads the checkpoint on disk, not the weights in memory, so the control has
    to be a file. Returns whether the trained weights differ from the fresh ones at all.
    """
    model_cls = import_entrypoint(cfg.model_name, "Model", field="model_name")
    state = torch.load(best, map_location="cpu")
    torch.manual_seed(cfg.seed)
    fresh = model_cls(**cfg.model_params).state_dict()
    differs = not torch.equal(state["model"][FIRST_WEIGHT], fresh[FIRST_WEIGHT])
    state["model"] = fresh
    torch.save(state, Path(directory) / CONTROL_NAME)
    return differs


def main():
    """Score the trained encoder and its controls, print each check and the verdict."""
    importable_from_cwd()
    from examples.contrastive.metrics.knn_probe import KNNProbeAccuracy

    cfg = load_config_from_file(str(CONFIG))
    best = find_best_checkpoint(cfg.save_dir, prefix="valid_")
    if best is None:
        print(f"no valid_best_result_checkpoint_*.pt in {cfg.save_dir}.")
        print(f"  Train first: {TRAIN_COMMAND}")
        return 1
    print(f"trained checkpoint: {best}")

    trained, trainer = probe(cfg.save_dir)
    raw = raw_baseline(trainer, KNNProbeAccuracy)
    with tempfile.TemporaryDirectory() as directory:
        differs = untrained_control(best, cfg, directory)
        untrained, _ = probe(directory)

    print(f"\nchance      {1 / trainer.bank_info['num_classes']:.4f}")
    print(f"raw inputs  {raw:.4f}")
    print(f"untrained   {untrained:.4f}")
    print(f"trained     {trained:.4f}\n")
    checks = [
        (f"{FIRST_WEIGHT} differs from a fresh init", differs, "differs" if differs else "equal"),
        (
            f"trained > raw + {MARGIN}",
            trained > raw + MARGIN,
            f"{trained:.4f} vs {raw + MARGIN:.4f}",
        ),
        (
            f"trained > untrained + {MARGIN}",
            trained > untrained + MARGIN,
            f"{trained:.4f} vs {untrained + MARGIN:.4f}",
        ),
    ]
    for name, ok, observed in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {observed}")
    failed = sum(not ok for _, ok, _ in checks)
    print(f"\n{len(checks) - failed} passed, {failed} failed")
    print("LEARNED" if not failed else "NO EVIDENCE")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
