"""Verification for the causal_lm example: the data, what the model learned, and its exports at
lengths the training never used.

Train first, then run from the repository root, either way::

    gatle-ignite train --config=examples/causal_lm/configs/causal_lm_v0.py
    python -m examples.causal_lm.scripts.checks
    python examples/causal_lm/scripts/checks.py

Exits 0 only when every check passed. It catches a model that does not learn (a learning rate
of 0: check 3), an export whose length is fixed at the training one (check 5) and a
safetensors file that does not rebuild the model (check 5, safetensors).
"""

import json
import math
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
CONFIG = SOURCE_ROOT / "examples" / "causal_lm" / "configs" / "causal_lm_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/causal_lm/configs/causal_lm_v0.py"

# The trained model must beat the best model that sees no context (byte frequencies alone)
# by this factor; an untrained one is near the 256 of uniform guessing.
MAX_PPL_SHARE_OF_UNIGRAM = 0.55
MIN_UNTRAINED_PPL = 100.0
TRAINING_LENGTH = 64
# (rows, length): other batch sizes and lengths than training's, the position table's 128 too.
SHAPES = ((3, 17), (2, 100), (1, 128))
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
    """Checks 1-2: the text is the standard library's own files; the splits share no byte."""
    from examples.causal_lm.dataloaders import text_bytes

    data = text_bytes.read_bytes()
    report.check(
        "1. the text is read from Python's own standard library files",
        len(data) > 100_000 and int(data.max()) < 256,
        f"{len(data)} bytes of {', '.join(text_bytes.MODULES)}",
    )
    train = get_dataset(cfg.train_ds_name, cfg.train_ds_params)[0].dataset
    valid = get_dataset(cfg.valid_ds_name, cfg.valid_ds_params)[0].dataset
    cut = int(len(data) * 0.9)
    shifted = all(torch.equal(x[1:], y[:-1]) for x, y in (train[0], valid[-1]))
    report.check(
        "2. every window's target is its input shifted by one byte; the splits do not overlap",
        shifted and torch.equal(valid[0][0], data[cut : cut + TRAINING_LENGTH]),
        f"{len(train)} train and {len(valid)} valid windows of {TRAINING_LENGTH}, cut at {cut}",
    )
    return data[:cut], data[cut:]


def unigram_perplexity(train, valid) -> float:
    """The perplexity of the valid bytes under the train bytes' frequencies: no context."""
    counts = torch.bincount(train, minlength=256).double() + 1
    log_p = (counts / counts.sum()).log()
    return math.exp(-float(log_p[valid].mean()))


def check_learning(report, cfg, unigram):
    """Checks 3-4: the best checkpoint has learned far more than byte frequencies; the same
    model untrained has not."""
    Trainer = import_entrypoint(cfg.main_runner, "Trainer")
    best = find_best_checkpoint(cfg.save_dir, prefix="valid_")
    limit = MAX_PPL_SHARE_OF_UNIGRAM * unigram
    name = (
        f"3. best checkpoint valid/ppl < {MAX_PPL_SHARE_OF_UNIGRAM} x {unigram:.2f} (bytes alone)"
    )
    if best is None:
        report.check(name, False, f"no valid_best_result_* checkpoint in {cfg.save_dir}")
        print(f"      Train first: {TRAIN_COMMAND}")
    else:
        scores = Trainer(0, inference_cfg()).evaluate()
        ppl = float(scores["valid/ppl"])
        report.check(name, ppl < limit, f"{ppl:.3f} < {limit:.3f} (acc {scores['valid/acc']:.3f})")
    untrained = Trainer(0, inference_cfg()).evaluate(load_checkpoint=False)["valid/ppl"]
    report.check(
        f"4. untrained control valid/ppl > {MIN_UNTRAINED_PPL} (uniform: 256)",
        untrained > MIN_UNTRAINED_PPL,
        f"{untrained:.1f}",
    )
    return best is not None


def _best_model(cfg):
    """The best checkpoint's model, as the trainer builds and loads it."""
    trainer = import_entrypoint(cfg.main_runner, "Trainer")(0, inference_cfg()).setup()
    load_eval_checkpoint(trainer)
    return trainer.model.eval()


def _run_export(fmt, out, ids):
    """The exported artefact run by its own library, as a user would: the logits."""
    if fmt == "safetensors":
        from safetensors.torch import load_file

        rebuild = json.loads((out / "config.json").read_text())
        model = import_entrypoint(rebuild["model_name"], "Model")(**rebuild["model_params"])
        model.load_state_dict(load_file(out / "model.safetensors"))
        return model.eval()(input_ids=ids).logits
    if fmt == "pt2":
        return torch.export.load(out / "model.pt2").module()(input_ids=ids)["logits"]
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(out / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return torch.from_numpy(session.run(["logits"], {"input_ids": ids.numpy()})[0])


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


def check_exports(report, cfg, valid):
    """Checks 5-7: each format exported, checked by gatle-ignite, then run here at other lengths
    and batch sizes than training's against the best checkpoint's model; the program refuses a
    length past the position table; the cards say what is dynamic and what is tied."""
    model = _best_model(cfg)
    exported = Path(cfg.save_dir).parent / "exported"
    for fmt in ("safetensors", "pt2", "onnx"):
        out = export_model(load_config_from_file(str(CONFIG)), fmt, exported / fmt, force=True)
        inputs = [valid[: rows * length].reshape(rows, length) for rows, length in SHAPES]
        same, observed = _compare(fmt, out, model, inputs, "input_ids")
        report.check(
            f"5. {fmt} at lengths {[length for _, length in SHAPES]} (trained at "
            f"{TRAINING_LENGTH}) computes the model's logits",
            same,
            observed,
        )
    program = torch.export.load(exported / "pt2" / "model.pt2").module()
    try:
        program(input_ids=valid[:129].reshape(1, 129))
        refused = "ran"
    except Exception as error:
        refused = str(error).splitlines()[0]
    report.check(
        "6. the pt2 program refuses 129 bytes, past the position table",
        refused != "ran",
        refused[:100],
    )
    dynamic = (exported / "onnx" / "README.md").read_text()
    tied = (exported / "safetensors" / "README.md").read_text()
    report.check(
        "7. the cards say the length is dynamic up to 128, and which weights are tied",
        "`input_ids` dim 1, 2 to 128 (the position table transformer.wpe.weight" in dynamic
        and "| Tied weights | `transformer.wte.weight` = `lm_head.weight`" in tied,
        "the onnx card's Dynamic dimensions, the safetensors card's Tied weights",
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
    train, valid = check_data(report, cfg)
    if check_learning(report, cfg, unigram_perplexity(train, valid)):
        check_exports(report, cfg, valid)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
