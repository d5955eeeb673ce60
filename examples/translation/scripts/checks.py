"""Verification for the translation example: masking, gradients and real autoregressive decoding.

Run from the repository root, after training::

    gatle-ignite train --config=examples/translation/configs/translation_v0.py
    python -m examples.translation.scripts.checks

It loads the best checkpoint (the largest file-name score, which holds -wer) and checks it on
the validation split. Exits 0 only when every check passed.
"""

import sys
from pathlib import Path

import torch

from examples.translation.dataloaders.data_utils.vocab import N_SPECIAL, PAD_ID
from examples.translation.metrics.edit_distance import EditDistance, _strip
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.data.helpers import get_dataset
from gatle_ignite.dispatch import import_entrypoint
from gatle_ignite.utils.checkpoints import find_best_checkpoint

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "translation_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/translation/configs/translation_v0.py"

MIN_PAD_FRACTION = 0.05
MIN_MOVE = 1e-4
MIN_UNTRAINED_WER = 0.7
MAX_TRAINED_WER = 0.15
MIN_TRAINED_EXACT = 0.80
MIN_MATCHED_EXACT = 0.8
MAX_ROLLED_EXACT = 0.1
N_SHOWN = 6


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
        if not self.failed:
            print("ALL CHECKS PASSED")
        return 1 if self.failed else 0


def build_model(cfg, state=None):
    """The config's model, seeded as a run starts, with ``state``'s weights when given."""
    Model = import_entrypoint(cfg.model_name, "Model", field="model_name")
    torch.manual_seed(cfg.seed)
    model = Model(**cfg.model_params)
    if state is not None:
        model.load_state_dict(state["model"])
    return model.eval()


def configured_loss(cfg, **overrides):
    """The ``ce`` term exactly as training builds it, with ``overrides`` on its params."""
    entry = cfg.criterion_params.dict_of_loss_params.ce
    Loss = import_entrypoint(entry.cls_name, "Loss", field="dict_of_loss_params.ce.cls_name")
    return Loss(**{**entry.get("loss_params", {}), **overrides})


def decode(task, model, batch, roll=False):
    """Greedy decodes of ``batch`` through the trainer's eval ``prep_batch``, or None.

    ``roll`` pairs every target with the next row's source.
    """
    model_input = dict(task.prep_batch(batch, split="valid")["model_input"])
    if roll:
        for key in ("src_feats", "src_pad_mask"):
            model_input[key] = model_input[key].roll(1, dims=0)
    with torch.no_grad():
        return model(**model_input).get("pred_tokens")


def corpus_scores(task, model, loader, info, roll=False):
    """``(wer, exact)`` of greedy decoding over ``loader``, or None if the model never decoded."""
    wer = EditDistance("wer", pad_id=info["pad_id"], eos_id=info["eos_id"])
    exact = EditDistance("exact", pad_id=info["pad_id"], eos_id=info["eos_id"])
    for batch in loader:
        pred = decode(task, model, batch, roll=roll)
        if pred is None:
            return None
        wer.update((pred, batch["tgt_out"]))
        exact.update((pred, batch["tgt_out"]))
    return wer.compute(), exact.compute()


def check_padding_is_masked(report, cfg, model, batch):
    tgt = batch["tgt_out"]
    pad = tgt == PAD_ID
    fraction = float(pad.float().mean())
    report.check(
        f"at least {MIN_PAD_FRACTION:.0%} of targets are PAD",
        fraction >= MIN_PAD_FRACTION,
        f"{fraction:.3f}",
    )
    with torch.no_grad():
        logits = model(batch["src_feats"], batch["src_pad_mask"], batch["tgt_in"])["logits"]
    corrupted = logits.clone()
    noise = torch.randn(corrupted.shape, generator=torch.Generator().manual_seed(0))
    corrupted[pad] = 10.0 * noise[pad]
    target = {"targets": {"tgt_out": tgt}}
    masked, unmasked = configured_loss(cfg), configured_loss(cfg, ignore_index=-100)
    m_clean, m_bad = (float(masked({"logits": x}, target)) for x in (logits, corrupted))
    u_clean, u_bad = (float(unmasked({"logits": x}, target)) for x in (logits, corrupted))
    report.check(
        "corrupting pad-position logits leaves the masked loss exactly equal",
        m_clean == m_bad,
        f"{m_clean:.6f} -> {m_bad:.6f}",
    )
    report.check(
        f"the unmasked control (ignore_index=-100) moves by > {MIN_MOVE}",
        abs(u_bad - u_clean) > MIN_MOVE,
        f"{u_clean:.3f} -> {u_bad:.3f}",
    )
    report.check(
        f"masked and unmasked losses differ by > {MIN_MOVE}",
        abs(u_clean - m_clean) > MIN_MOVE,
        f"masked {m_clean:.4f}, unmasked {u_clean:.4f}",
    )


def check_grad_does_not_flow_to_pad(report, cfg, model, batch):
    tgt = batch["tgt_out"]
    pad = tgt == PAD_ID
    with torch.no_grad():
        logits = model(batch["src_feats"], batch["src_pad_mask"], batch["tgt_in"])["logits"]
    logits.requires_grad_(True)
    configured_loss(cfg)({"logits": logits}, {"targets": {"tgt_out": tgt}}).backward()
    per_position = logits.grad.abs().sum(dim=-1)
    at_pad = float(per_position[pad].max())
    at_real = float(per_position[~pad].mean())
    report.check("the gradient at PAD positions is exactly 0", at_pad == 0.0, f"{at_pad:.3e}")
    report.check("the gradient at real positions is > 0", at_real > 0.0, f"{at_real:.3e}")


def check_autoregressive_decode(report, task, cfg, model, loader, info):
    untrained = corpus_scores(task, build_model(cfg), loader, info)
    trained = corpus_scores(task, model, loader, info)
    if untrained is None or trained is None:
        report.check("greedy decoding on the valid split", False, "the model returned no tokens")
        return
    report.check(
        f"untrained wer > {MIN_UNTRAINED_WER}",
        untrained[0] > MIN_UNTRAINED_WER,
        f"wer {untrained[0]:.4f}, exact {untrained[1]:.4f}",
    )
    report.check(
        f"trained wer < {MAX_TRAINED_WER}", trained[0] < MAX_TRAINED_WER, f"{trained[0]:.4f}"
    )
    report.check(
        f"trained exact > {MIN_TRAINED_EXACT}", trained[1] > MIN_TRAINED_EXACT, f"{trained[1]:.4f}"
    )


def check_decode_is_not_teacher_forcing(report, task, model, batch, info):
    scores = [corpus_scores(task, model, [batch], info, roll=roll) for roll in (False, True)]
    if None in scores:
        report.check(
            "the valid split decodes",
            False,
            "no pred_tokens: the eval model_input carries tgt_in (teacher forcing)",
        )
        return
    matched, rolled = scores[0][1], scores[1][1]
    report.check(
        f"exact match with the matching sources > {MIN_MATCHED_EXACT}",
        matched > MIN_MATCHED_EXACT,
        f"{matched:.4f}",
    )
    report.check(
        f"exact match with sources rolled within the batch < {MAX_ROLLED_EXACT}",
        rolled < MAX_ROLLED_EXACT,
        f"{rolled:.4f}",
    )


def words(tokens, info):
    """Token ids before EOS, as target-word indices."""
    return [t - N_SPECIAL for t in _strip(tokens, info["pad_id"], info["eos_id"])]


def show_examples(task, model, batch, info):
    pred = decode(task, model, batch)
    if pred is None:
        return
    print("\nsample decodes (target-word indices):")
    for ref, hyp in zip(batch["tgt_out"][:N_SHOWN].tolist(), pred[:N_SHOWN].tolist()):
        ref, hyp = words(ref, info), words(hyp, info)
        print(f"  ref {ref!s:<16} hyp {hyp!s:<16} {'ok' if ref == hyp else 'WRONG'}")


def main():
    cfg = load_config_from_file(str(CONFIG))
    best = find_best_checkpoint(cfg.save_dir, prefix="valid_")
    if best is None:
        print(f"no valid_best_result_checkpoint_*.pt in {cfg.save_dir}.")
        print(f"  Train first: {TRAIN_COMMAND}")
        return 1
    print(f"checking {best}")
    state = torch.load(best, map_location="cpu", weights_only=True)
    model = build_model(cfg, state)
    loader, info = get_dataset(cfg.valid_ds_name, cfg.valid_ds_params, field="valid_ds_name")
    batch = next(iter(loader))
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    task = trainer_cls(0, cfg)

    report = Report()
    check_padding_is_masked(report, cfg, model, batch)
    check_grad_does_not_flow_to_pad(report, cfg, model, batch)
    check_autoregressive_decode(report, task, cfg, model, loader, info)
    check_decode_is_not_teacher_forcing(report, task, model, batch, info)
    show_examples(task, model, batch, info)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
