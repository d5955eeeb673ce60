"""Models as libraries return them: a dataclass, or a ``transformers`` ``ModelOutput``, is the
step output as it is, through train, eval and predict."""

import math
import re

import pytest
import torch

from gatle_ignite.cli.main import main
from tests.toy.config_file import write_toy_config

QUICK = {"max_epochs": 6}


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def _cli(capsys, *args) -> str:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, out[-3000:] + err[-3000:]
    return out


def _printed(out: str, name: str) -> float:
    return float(re.search(rf"^{re.escape(name)}: (\S+)$", out, re.M).group(1))


def _train_eval_predict(capsys, tmp_path, **fields) -> tuple:
    """Train, evaluate and predict a config through the CLI: (eval's output, predictions,
    predict's output)."""
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **fields)
    train = _cli(capsys, "train", f"--config={config}")
    assert "TRAINING COMPLETE after" in train
    evaluated = _cli(capsys, "eval", f"--config={config}")
    out = tmp_path / "valid.pt"
    predicted = _cli(capsys, "predict", f"--config={config}", "--out", str(out))
    return evaluated, torch.load(out, weights_only=True), predicted


def test_a_dataclass_output_trains_evaluates_and_predicts(tmp_path, capsys):
    evaluated, predictions, predicted = _train_eval_predict(
        capsys,
        tmp_path,
        main_runner="tests.toy.record_trainer",
        model_name="tests.toy.record_model",
        criterion_name="gatle_ignite.losses.model_loss",
        criterion_params={},
        val_metrics={
            "acc": {"cls_name": "gatle_ignite.metrics.accuracy"},
            "loss": {
                "cls_name": "gatle_ignite.metrics.loss",
                "params": {"loss_name": "gatle_ignite.losses.model_loss"},
            },
        },
        **QUICK,
    )
    assert 0.5 < _printed(evaluated, "valid/acc") <= 1.0
    assert 0.0 < _printed(evaluated, "valid/loss") < math.log(3)
    # The logits, one row per sample; the batch's loss has none and is named as left out.
    assert sorted(predictions) == ["logits"] and predictions["logits"].shape == (32, 3)
    assert "loss: left out, one value per batch" in predicted


def test_a_transformers_model_output_trains_evaluates_and_predicts(tmp_path, capsys):
    pytest.importorskip("transformers")
    evaluated, predictions, predicted = _train_eval_predict(
        capsys,
        tmp_path,
        main_runner="tests.toy.hf_lm",
        model_name="tests.toy.hf_lm",
        model_params={},
        train_ds_name="tests.toy.hf_lm",
        train_ds_params={"n": 64, "bs": 16, "shuffle": True},
        valid_ds_name="tests.toy.hf_lm",
        valid_ds_params={"n": 24, "bs": 16, "seed": 1},
        criterion_name="gatle_ignite.losses.model_loss",
        criterion_params={},
        val_metrics={
            "perplexity": {
                "cls_name": "gatle_ignite.metrics.perplexity",
                "params": {"tgt_name": "next"},
            },
            "loss": {
                "cls_name": "gatle_ignite.metrics.loss",
                "params": {"loss_name": "gatle_ignite.losses.model_loss"},
            },
        },
        score_name="valid/perplexity",
        score_factor=-1,
        optimizer_params={"lr": 3e-3, "weight_decay": 0.0},
        **QUICK,
    )
    perplexity, loss = _printed(evaluated, "valid/perplexity"), _printed(evaluated, "valid/loss")
    # Every block is full: the model's own shifted loss, averaged, is the token mean.
    assert perplexity == pytest.approx(math.exp(loss), rel=1e-4)
    assert 1.0 < perplexity < 32.0  # below the vocabulary's: it learnt something
    logits = predictions["logits"]
    assert logits.shape == (24, 8, 32)
    # The batch's loss and the key-value cache have no row per sample.
    assert "loss: left out, one value per batch" in predicted
    assert re.search(r"\w+: left out, a \w*Cache", predicted), predicted
