"""The built-in losses against hand computations, as composite terms and as the whole criterion."""

import dataclasses
import math
from typing import Optional

import numpy as np
import pytest
import torch

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.losses import (
    bce_with_logits,
    composite,
    cross_entropy,
    l1,
    model_loss,
    mse,
    smooth_l1,
)
from tests.toy.config import toy_config
from tests.toy.trainer import Trainer


def _prepared(**targets):
    return {"model_input": {}, "targets": targets}


def _hand_ce(logits: np.ndarray, labels: np.ndarray, ignore=-100, smoothing=0.0) -> float:
    """Token by token: -(1 - s) log p[y] - s * mean(log p), averaged over kept tokens."""
    losses = []
    for row, label in zip(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)):
        if label == ignore:
            continue
        logp = row - row.max() - math.log(np.exp(row - row.max()).sum())
        losses.append(-(1 - smoothing) * logp[label] - smoothing * logp.mean())
    return float(np.mean(losses))


@pytest.fixture
def sequences():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 6, 11, generator=gen)
    labels = torch.randint(0, 11, (3, 6), generator=gen)
    labels[0, 4:] = -100
    labels[2, 1:] = -100
    return logits, labels


def test_sequence_logits_against_token_targets_with_padding_and_smoothing(sequences):
    logits, labels = sequences
    term = cross_entropy.Loss(src_name="logits", tgt_name="labels", label_smoothing=0.1)
    got = term({"logits": logits}, _prepared(labels=labels))
    want = _hand_ce(logits.double().numpy(), labels.numpy(), smoothing=0.1)
    assert float(got) == pytest.approx(want, rel=1e-5)
    # Read classes last: torch's own layout would take the 6 positions for classes and fail.
    plain = cross_entropy.Loss(src_name="logits", tgt_name="labels")
    assert float(plain({"logits": logits}, _prepared(labels=labels))) == pytest.approx(
        _hand_ce(logits.double().numpy(), labels.numpy()), rel=1e-5
    )


def test_torchs_layout_classes_in_dim_1_and_per_position_values(sequences):
    logits, labels = sequences
    labels = labels.clamp(min=0)
    term = cross_entropy.Loss(reduction="none")
    # (B, V, T) against (B, T): classes in dimension 1.
    moved = term({"logits": logits.movedim(-1, 1)}, _prepared(labels=labels))
    last = term({"logits": logits}, _prepared(labels=labels))
    assert moved.shape == last.shape == labels.shape
    assert torch.allclose(moved, last, atol=1e-6)


def test_class_weights_given_as_a_list_and_integer_targets_of_any_width():
    logits = torch.tensor([[2.0, 0.0], [2.0, 0.0]])
    labels = torch.tensor([0, 1], dtype=torch.int32)
    term = cross_entropy.Loss(weight=[1.0, 3.0])
    right, wrong = -math.log(1 / (1 + math.exp(-2))), -math.log(1 / (1 + math.exp(2)))
    # torch's weighted mean: each target's loss times its class weight, over the weights' sum.
    want = (1.0 * right + 3.0 * wrong) / 4.0
    assert float(term({"logits": logits}, _prepared(labels=labels))) == pytest.approx(want)


def test_probability_targets_of_the_logits_shape():
    logits = torch.tensor([[0.0, 0.0]])
    soft = torch.tensor([[0.25, 0.75]])
    got = cross_entropy.Loss()({"logits": logits}, _prepared(labels=soft))
    assert float(got) == pytest.approx(math.log(2))


def test_shapes_that_fit_no_layout_are_a_config_error_naming_them():
    with pytest.raises(ConfigError, match=r"cross_entropy of 'logits'.*\[4, 3\].*\[5\]"):
        cross_entropy.Loss()({"logits": torch.zeros(4, 3)}, _prepared(labels=torch.zeros(5)))


ELEMENTWISE = {
    "mse": (mse.Loss, lambda d: d**2),
    "l1": (l1.Loss, np.abs),
    "smooth_l1": (smooth_l1.Loss, lambda d: np.where(np.abs(d) < 1, 0.5 * d**2, np.abs(d) - 0.5)),
}


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_regression_losses_are_the_mean_over_elements(name):
    cls, per_element = ELEMENTWISE[name]
    pred = torch.tensor([[0.5], [3.0], [-1.0]])  # a (B, 1) head against (B,) targets
    target = torch.tensor([0, 1, 1])  # integer targets take the prediction's dtype
    got = cls(src_name="pred")({"pred": pred}, _prepared(labels=target))
    diff = pred.squeeze(-1).double().numpy() - target.double().numpy()
    assert float(got) == pytest.approx(float(per_element(diff).mean()))


def test_a_regression_shape_mismatch_is_refused_not_broadcast():
    with pytest.raises(ConfigError, match=r"mse of 'pred'.*\[3, 2\].*\[3\].*must be the same"):
        mse.Loss(src_name="pred")({"pred": torch.zeros(3, 2)}, _prepared(labels=torch.zeros(3)))


def test_bce_with_logits_with_a_positive_weight_list():
    logits = torch.tensor([[0.0, 2.0]])
    labels = torch.tensor([[1, 0]])
    got = bce_with_logits.Loss(pos_weight=[2.0, 1.0])({"logits": logits}, _prepared(labels=labels))
    want = (2.0 * math.log(2) + math.log(1 + math.exp(2))) / 2
    assert float(got) == pytest.approx(want)


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    loss: Optional[torch.Tensor] = None


def test_model_loss_reads_the_loss_the_model_returned():
    loss = torch.tensor(1.5)
    assert model_loss.Loss()({"loss": loss, "logits": torch.zeros(1)}, {}) is loss
    assert model_loss.Loss()(Output(torch.zeros(1), loss), {}) is loss


@pytest.mark.parametrize("output", [{"logits": torch.zeros(1)}, Output(torch.zeros(1))])
def test_model_loss_without_a_loss_says_to_give_the_model_its_labels(output):
    with pytest.raises(ConfigError, match="given its labels: add them to prep_batch's model_input"):
        model_loss.Loss()(output, {})


def test_a_dataclass_output_is_read_by_field_name():
    logits = torch.tensor([[0.0, 0.0]])
    got = cross_entropy.Loss()(Output(logits), _prepared(labels=torch.tensor([1])))
    assert float(got) == pytest.approx(math.log(2))
    with pytest.raises(ConfigError, match=r"could not resolve 'scores'; the Output has"):
        cross_entropy.Loss(src_name="scores")(Output(logits), _prepared(labels=torch.tensor([1])))


def test_builtins_are_composite_terms():
    criterion = composite.Loss(
        {
            "ce": {"cls_name": "gatle_ignite.losses.cross_entropy", "weight": 0.5},
            "l1": {
                "cls_name": "gatle_ignite.losses.l1",
                "loss_params": {"tgt_name": "values"},
                "weight": 2.0,
            },
        }
    )
    logits = torch.tensor([[0.0, 0.0]])
    total, parts = criterion({"logits": logits}, _prepared(labels=torch.tensor([1]), values=logits))
    assert float(parts["loss_ce"]) == pytest.approx(0.5 * math.log(2))
    assert float(parts["loss_l1"]) == 0.0
    assert float(total) == pytest.approx(0.5 * math.log(2))


def test_a_builtin_named_as_the_criterion_trains_and_logs_the_total_alone(tmp_path):
    cfg = toy_config(
        save_dir=str(tmp_path / "run"),
        criterion_name="gatle_ignite.losses.cross_entropy",
        criterion_params={"src_name": "logits", "tgt_name": "labels", "label_smoothing": 0.05},
        val_metrics={
            "acc": {"cls_name": "gatle_ignite.metrics.accuracy"},
            "loss": {"cls_name": "gatle_ignite.metrics.loss", "params": {"tgt_name": "labels"}},
        },
        max_epochs=3,
    )
    trainer = Trainer(0, cfg).fit()
    train = trainer.engines["trainer"].state.metrics
    assert sorted(k for k in train if "loss" in k) == ["train/loss_avg"]
    valid = trainer.engines["evaluator"].state.metrics
    assert 0.0 < valid["valid/loss"] < math.log(3) and valid["valid/acc"] > 0.5


def test_the_builtin_named_directly_trains_exactly_as_the_04_composite_of_an_own_term(tmp_path):
    """The toy task's config (a composite of its own cross-entropy term and its own accuracy)
    against the same task said with the built-ins: the same losses, accuracy and weights."""
    runs = {}
    for name, fields in {
        "own": {},
        "builtin": {
            "criterion_name": "gatle_ignite.losses.cross_entropy",
            "criterion_params": {},
            "val_metrics": {"acc": {"cls_name": "gatle_ignite.metrics.accuracy"}},
        },
    }.items():
        trainer = Trainer(0, toy_config(save_dir=str(tmp_path / name), **fields)).fit()
        runs[name] = trainer
    own, builtin = runs["own"], runs["builtin"]
    assert (
        own.engines["trainer"].state.metrics["train/loss_avg"]
        == (builtin.engines["trainer"].state.metrics["train/loss_avg"])
    )
    assert own.engines["evaluator"].state.metrics == builtin.engines["evaluator"].state.metrics
    for a, b in zip(own.model.state_dict().values(), builtin.model.state_dict().values()):
        assert torch.equal(a, b)
