"""Verification for the resnet_digits example: the split and the augmentation, what the model
learned, and its exports at image sizes the training never used.

Train first, then run from the repository root, either way::

    gatle-ignite train --config=examples/resnet_digits/configs/resnet_digits_v0.py
    python -m examples.resnet_digits.scripts.checks
    python examples/resnet_digits/scripts/checks.py

Exits 0 only when every check passed. It catches a model that does not learn (a learning rate
of 0: check 3), an augmentation that reaches the validation split or changes nothing (check 2)
and an export whose image size is fixed at the training one (check 5).
"""

import json
import sys
from pathlib import Path

import torch

from gatle_ignite import get_dataset
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import import_entrypoint
from gatle_ignite.export.command import export_model
from gatle_ignite.trainer.checkpointing import load_eval_checkpoint
from gatle_ignite.utils.checkpoints import find_best_checkpoint

SOURCE_ROOT = Path(__file__).resolve().parents[3]
CONFIG = SOURCE_ROOT / "examples" / "resnet_digits" / "configs" / "resnet_digits_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/resnet_digits/configs/resnet_digits_v0.py"

N_TRAIN, N_VALID = 1437, 360
MIN_TRAINED_ACC = 0.93
MAX_UNTRAINED_ACC = 0.25
TRAINING_SIZE = 16
# (rows, height, width): other batch sizes and image sizes than training's, square or not.
SHAPES = ((5, 24, 24), (3, 12, 20))
ONNX_ATOL, ONNX_RTOL = 1e-4, 1e-3


class Report:
    """Collects PASS / FAIL lines and prints the tally."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, observed):
        self.passed += bool(ok)
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {observed}")

    def finish(self):
        print(f"\n{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def inference_cfg():
    """The config in inference mode: load the best checkpoint, log and write nothing."""
    cfg = load_config_from_file(str(CONFIG))
    cfg.run = True
    cfg.load_from_ckpt = "best"
    cfg.logger_name = []
    cfg.save_ckpt = False
    return cfg


def check_data(report, cfg):
    """Checks 1-2: the split, and an augmentation that changes training batches only."""
    train = get_dataset(cfg.train_ds_name, cfg.train_ds_params)[0].dataset
    valid_loader = get_dataset(cfg.valid_ds_name, cfg.valid_ds_params)[0]
    report.check(
        f"1. {N_TRAIN} train and {N_VALID} valid images of {TRAINING_SIZE}x{TRAINING_SIZE}",
        (len(train), len(valid_loader.dataset)) == (N_TRAIN, N_VALID)
        and tuple(train[0][0].shape) == (1, TRAINING_SIZE, TRAINING_SIZE),
        f"{len(train)} + {len(valid_loader.dataset)}, {list(train[0][0].shape)}",
    )
    trainer = import_entrypoint(cfg.main_runner, "Trainer")(0, inference_cfg())
    images, labels = next(iter(valid_loader))

    def prepared(split):
        return trainer.prep_batch((images, labels), split=split)["model_input"]["pixel_values"]

    first, second = prepared("train"), prepared("train")
    changed = float((first - images).abs().amax(dim=(1, 2, 3)).min())
    redrawn = float((first - second).abs().max())
    still = float((prepared("valid") - images).abs().max())
    report.check(
        "2. prep_batch augments every training image, afresh each time, and no valid one",
        changed > 0.01 and redrawn > 0.01 and still == 0.0,
        f"train: least max |change| {changed:.3g}, between two draws {redrawn:.3g}; "
        f"valid: {still:.3g}",
    )


def check_learning(report, cfg):
    """Checks 3-4: the best checkpoint has learned; the same model untrained has not."""
    Trainer = import_entrypoint(cfg.main_runner, "Trainer")
    best = find_best_checkpoint(cfg.save_dir, prefix="valid_")
    name = f"3. best checkpoint valid/acc > {MIN_TRAINED_ACC}"
    if best is None:
        report.check(name, False, f"no valid_best_result_* checkpoint in {cfg.save_dir}")
        print(f"      Train first: {TRAIN_COMMAND}")
    else:
        acc = float(Trainer(0, inference_cfg()).evaluate()["valid/acc"])
        report.check(name, acc > MIN_TRAINED_ACC, f"{acc:.4f} ({Path(best).name})")
    untrained = float(Trainer(0, inference_cfg()).evaluate(load_checkpoint=False)["valid/acc"])
    report.check(
        f"4. untrained control valid/acc < {MAX_UNTRAINED_ACC} (chance 0.10)",
        untrained < MAX_UNTRAINED_ACC,
        f"{untrained:.4f}",
    )
    return best is not None


def _best_model(cfg):
    """The best checkpoint's model, as the trainer builds and loads it."""
    trainer = import_entrypoint(cfg.main_runner, "Trainer")(0, inference_cfg()).setup()
    load_eval_checkpoint(trainer)
    return trainer.model.eval()


def _run_export(fmt, out, images):
    """The exported artefact run by its own library, as a user would: the logits."""
    if fmt == "safetensors":
        from safetensors.torch import load_file

        rebuild = json.loads((out / "config.json").read_text())
        model = import_entrypoint(rebuild["model_name"], "Model")(**rebuild["model_params"])
        model.load_state_dict(load_file(out / "model.safetensors"))
        return model.eval()(pixel_values=images).logits
    if fmt == "pt2":
        return torch.export.load(out / "model.pt2").module()(pixel_values=images)["logits"]
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(out / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return torch.from_numpy(session.run(["logits"], {"pixel_values": images.numpy()})[0])


def _compare(fmt, out, model, inputs, key):
    """Whether the artefact gives the model's logits on every one of ``inputs`` (exactly, ONNX
    within its tolerance), and the largest difference or the artefact's refusal."""
    worst = 0.0
    for value in inputs:
        try:
            got = _run_export(fmt, out, value)
        except Exception as error:
            return False, f"{list(value.shape)} refused: {str(error).splitlines()[0][:100]}"
        with torch.no_grad():
            want = model(**{key: value}).logits
        if fmt == "onnx":
            same = torch.allclose(got, want, atol=ONNX_ATOL, rtol=ONNX_RTOL)
        else:
            same = torch.equal(got, want)
        worst = max(worst, float((got - want).abs().max()))
        if not same:
            return False, f"{list(value.shape)}: max abs diff {worst:.3g}"
    return True, f"max abs diff {worst:.3g}"


def check_exports(report, cfg):
    """Checks 5-6: each format exported, checked by gatle-ignite, then run here at other image
    sizes and batch sizes than training's against the best checkpoint's model (BatchNorm in
    eval mode); the card says which dimensions are dynamic."""
    model = _best_model(cfg)
    exported = Path(cfg.save_dir).parent / "exported"
    generator = torch.Generator().manual_seed(0)
    for fmt in ("safetensors", "pt2", "onnx"):
        out = export_model(load_config_from_file(str(CONFIG)), fmt, exported / fmt, force=True)
        inputs = [torch.rand(rows, 1, h, w, generator=generator) for rows, h, w in SHAPES]
        same, observed = _compare(fmt, out, model, inputs, "pixel_values")
        report.check(
            f"5. {fmt} at {[f'{h}x{w}' for _, h, w in SHAPES]} (trained at "
            f"{TRAINING_SIZE}x{TRAINING_SIZE}) computes the model's logits",
            same,
            observed,
        )
    card = (exported / "onnx" / "README.md").read_text()
    report.check(
        "6. the card says the batch, the height and the width are dynamic",
        all(f"`pixel_values` dim {dim}, 2 and up" in card for dim in (0, 2, 3)),
        "the onnx card's Dynamic dimensions",
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
    check_data(report, cfg)
    if check_learning(report, cfg):
        check_exports(report, cfg)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
