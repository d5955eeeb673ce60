"""The built-in metrics against hand computations, alone and under DDP with an uneven split."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from ignite.engine import Engine

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.metrics import accuracy, f1, mae, perplexity, precision, top_k_accuracy
from tests.conftest import HANG_S, ROOT, child_env, free_port
from tests.toy import builtin_metrics as toy

IGNORE = toy.IGNORE


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    shifted = scores - scores.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _per_class(predicted: np.ndarray, labels: np.ndarray, classes) -> tuple:
    """Each class's (precision, recall), counted one sample at a time."""
    precisions, recalls = [], []
    for c in classes:
        hits = sum(1 for p, y in zip(predicted, labels) if p == c and y == c)
        said = sum(1 for p in predicted if p == c)
        real = sum(1 for y in labels if y == c)
        precisions.append(hits / said if said else 0.0)
        recalls.append(hits / real if real else 0.0)
    return np.array(precisions), np.array(recalls)


def _f1(p, r):
    return np.where(p + r > 0, 2 * p * r / np.maximum(p + r, 1e-300), 0.0)


def by_hand() -> dict:
    """Every value of ``toy.METRICS``, from the split's numbers with numpy alone."""
    d = {
        k: v.double().numpy() if v.is_floating_point() else v.numpy()
        for k, v in toy.split().items()
    }
    predicted = d["cls"].argmax(-1)
    labels = d["cls_labels"]
    p, r = _per_class(predicted, labels, range(toy.C))
    top2 = np.argsort(-d["cls"], axis=-1)[:, :2]
    kept = d["tokens"] != IGNORE
    token_logp = np.take_along_axis(
        _log_softmax(d["seq"]), np.where(kept, d["tokens"], 0)[..., None], axis=-1
    )[..., 0]
    decided = (d["bin"] > 0).astype(int)
    bp, br = _per_class(decided, d["bin_labels"], [1])
    sample_ce = -np.take_along_axis(_log_softmax(d["cls"]), labels[:, None], axis=-1)[:, 0]
    return {
        "acc": float((predicted == labels).mean()),
        "seq_acc": float((d["seq"].argmax(-1) == d["tokens"])[kept].mean()),
        "top2": float(np.mean([y in row for y, row in zip(labels, top2)])),
        "precision": float(p.mean()),
        "recall": float(r.mean()),
        "f1": float(_f1(p, r).mean()),
        "bin_acc": float((decided == d["bin_labels"]).mean()),
        "bin_f1": float(_f1(bp, br)[0]),
        "bin_precision": float(bp[0]),
        "bin_recall": float(br[0]),
        "perplexity": math.exp(-token_logp[kept].mean()),
        "mae": float(np.abs(d["reg"] - d["reg_targets"]).mean()),
        "mse": float(((d["reg"] - d["reg_targets"]) ** 2).mean()),
        "loss": float(sample_ce.mean()),
    }


def test_the_split_is_one_a_mistake_would_show():
    """Padding in the sequences, every class predicted, values away from 0 and 1."""
    d = toy.split()
    assert (d["tokens"] == IGNORE).any() and (d["tokens"] != IGNORE).any()
    assert set(d["cls"].argmax(-1).tolist()) == set(range(toy.C))
    hand = by_hand()
    assert all(0.05 < hand[k] < 0.95 for k in ("acc", "seq_acc", "precision", "f1", "bin_f1"))


@pytest.mark.parametrize("bs", [16, 127, 1])
def test_every_builtin_metric_equals_the_hand_computation(bs):
    values, hand = toy.evaluate(bs=bs), by_hand()
    assert values == pytest.approx(hand, rel=1e-5)


def _on_two_ranks(*args) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.toy.builtin_metrics", str(free_port()), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_under_ddp_with_an_uneven_last_shard_every_metric_is_the_one_process_value():
    # 127 samples: rank 0 holds 64, rank 1 63, its last batch short.
    two = _on_two_ranks()
    assert two == pytest.approx(toy.evaluate(), rel=1e-6)
    assert two == pytest.approx(by_hand(), rel=1e-5)
    # The negative control: a padding sampler scores one sample twice, and it shows.
    padded = _on_two_ranks("padded")
    assert padded != pytest.approx(by_hand(), rel=1e-5)


# ---- one metric at a time ----


def _run(metric, batches) -> float:
    engine = Engine(lambda _engine, batch: batch)
    metric.attach(engine, "m")
    engine.run(batches, max_epochs=1)
    return engine.state.metrics["m"]


def _step(y_pred, **targets):
    return {"y_pred": y_pred, "target": {"model_input": {}, "targets": targets}}


def test_sequence_logits_are_read_classes_last_and_torchs_layout_classes_in_dim_1():
    logits = torch.tensor([[[0.0, 5.0, 0.0], [5.0, 0.0, 0.0]]])  # (1, 2, 3): classes last
    labels = torch.tensor([[1, 2]])
    assert _run(accuracy.get_metric("valid", {}), [_step({"logits": logits}, labels=labels)]) == 0.5
    # The same scores in torch's (B, C, T) layout against (B, T).
    moved = logits.movedim(-1, 1)
    assert _run(accuracy.get_metric("valid", {}), [_step({"logits": moved}, labels=labels)]) == 0.5


def test_ignore_index_leaves_padding_out_of_accuracy():
    logits = torch.tensor([[[0.0, 5.0], [5.0, 0.0], [5.0, 0.0]]])
    labels = torch.tensor([[1, 1, -100]])
    batch = [_step({"logits": logits}, labels=labels)]
    assert _run(accuracy.get_metric("valid", {}, ignore_index=-100), batch) == 0.5
    # Without it the padded position counts, as a miss.
    assert _run(accuracy.get_metric("valid", {}), batch) == pytest.approx(1 / 3)
    assert _run(top_k_accuracy.get_metric("valid", {}, k=1, ignore_index=-100), batch) == 0.5


def test_perplexity_is_exp_of_the_token_mean_across_batches_of_unequal_token_counts():
    # Batch 1: one token of loss log(2); batch 2: three tokens of loss log(4).
    two_way = torch.zeros(1, 1, 2)
    four_way = torch.zeros(1, 3, 4)
    batches = [
        _step({"logits": two_way}, labels=torch.tensor([[0]])),
        _step({"logits": four_way}, labels=torch.tensor([[1, 2, 3]])),
    ]
    expected = math.exp((math.log(2) + 3 * math.log(4)) / 4)
    assert _run(perplexity.get_metric("valid", {}), batches) == pytest.approx(expected)
    # The mean of the two batches' means would be exp((log 2 + log 4) / 2): not this.
    assert expected != pytest.approx(math.exp((math.log(2) + math.log(4)) / 2))


def test_a_model_returning_one_tensor_is_read_as_it_is():
    scores = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    step = {"y_pred": scores, "target": {"targets": {"labels": torch.tensor([1, 1])}}}
    assert _run(accuracy.get_metric("valid", {}), [step]) == 0.5


def test_a_bare_tgt_name_is_looked_up_in_targets():
    step = _step({"logits": torch.tensor([[0.0, 1.0]])}, labels=torch.tensor([1]))
    assert _run(accuracy.get_metric("valid", {}, tgt_name="labels"), [step]) == 1.0


def test_one_score_per_target_is_positive_above_the_threshold():
    probs = torch.tensor([0.2, 0.6, 0.7, 0.4])
    labels = torch.tensor([0, 1, 0, 0])
    batch = [_step({"logits": probs}, labels=labels)]
    assert _run(accuracy.get_metric("valid", {}, threshold=0.5), batch) == 0.75
    # Positive class: precision 1/2, recall 1/1.
    got = _run(precision.get_metric("valid", {}, average="binary", threshold=0.5), batch)
    assert got == pytest.approx(0.5)
    assert _run(f1.get_metric("valid", {}, average="binary", threshold=0.5), batch) == (
        pytest.approx(2 * 0.5 * 1.0 / 1.5)
    )


def test_a_regression_head_of_shape_b_1_is_compared_with_b_targets():
    step = _step({"logits": torch.tensor([[1.0], [3.0]])}, labels=torch.tensor([2.0, 2.0]))
    assert _run(mae.get_metric("valid", {}), [step]) == pytest.approx(1.0)


def test_shapes_that_fit_no_rule_are_a_config_error_naming_them():
    step = _step({"logits": torch.zeros(4, 3)}, labels=torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"\[4, 3\].*\[4, 2\]"):
        _run(accuracy.get_metric("valid", {}), [step])
    step = _step({"logits": torch.zeros(4, 3)}, labels=torch.zeros(4))
    with pytest.raises(ConfigError, match="must be the same"):
        _run(mae.get_metric("valid", {}), [step])


def test_an_average_f1_cannot_take_is_refused_when_built():
    with pytest.raises(ConfigError, match="average='weighted'"):
        f1.get_metric("valid", {}, average="weighted")


@pytest.mark.parametrize("module", [accuracy, precision, f1, top_k_accuracy])
def test_a_batch_of_padding_alone_changes_nothing(module):
    gen = torch.Generator().manual_seed(0)
    padding = _step({"logits": torch.randn(2, 3, 5)}, labels=torch.full((2, 3), IGNORE))
    tokens = _step(
        {"logits": torch.randn(2, 3, 5, generator=gen)},
        labels=torch.randint(0, 5, (2, 3), generator=gen),
    )
    with_padding = _run(module.get_metric("valid", {}, ignore_index=IGNORE), [padding, tokens])
    assert with_padding == _run(module.get_metric("valid", {}, ignore_index=IGNORE), [tokens])
