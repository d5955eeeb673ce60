"""``gatle-ignite config --dry-run``: one batch of every split, shapes printed, nothing written."""

import re
import sys

import pytest

from gatle_ignite.cli.main import main
from tests.toy.config_file import write_toy_config

TOY_LOSS = "tests.toy.loss"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    # Task modules written by a test are imported from the working directory.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def _config(tmp_path, **fields):
    return write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **fields)


def _toy_trainer_with(tmp_path, module: str, method: str) -> str:
    """Write ``<module>.py``: the toy trainer with ``method`` (source lines) added; its name."""
    (tmp_path / f"{module}.py").write_text(
        "from tests.toy.trainer import Trainer as ToyTrainer\n\n\n"
        "class Trainer(ToyTrainer):\n" + method
    )
    return module


def test_dry_run_prints_the_shapes_and_the_loss_and_writes_nothing(tmp_path, capsys):
    assert main(["config", "--dry-run", f"--config={_config(tmp_path)}"]) == 0
    out = capsys.readouterr().out
    train = out[out.index("[train split] one batch") : out.index("[valid split] one batch")]
    assert "model_input: {x: float32[16, 8]}" in train
    assert "output:      {logits: float32[16, 3]}" in train
    assert re.search(r"losses: +\{loss: float32\[\] = \S+, loss_ce: float32\[\] = \S+\}", train)
    loss = float(re.search(r"^  loss: +(\S+)$", train, re.M).group(1))
    assert 0.0 < loss < 10.0
    assert f"train/loss_avg: {loss:.6g}" in train
    valid = out[out.index("[valid split] one batch") :]
    assert "output:      {logits: float32[16, 3]}" in valid and "valid/acc: " in valid
    assert "loss:" not in valid
    assert "[test split] no data (test_ds_name is not set): skipped" in out
    assert out.rstrip().endswith("dry run: every split went through the chain.")
    assert not (tmp_path / "run").exists()


def test_without_the_flag_no_batch_is_run(tmp_path, capsys):
    assert main(["config", f"--config={_config(tmp_path)}"]) == 0
    out = capsys.readouterr().out
    assert "all dotted paths resolve." in out and "one batch" not in out


def test_a_broken_prep_batch_is_one_config_error_naming_the_stage(tmp_path, capsys):
    runner = _toy_trainer_with(
        tmp_path,
        "broken_prep_trainer",
        "    def prep_batch(self, batch, split='train', **kwargs):\n"
        "        x, y, weights = batch\n"
        "        return {'model_input': {'x': x}, 'targets': {'labels': y, 'weights': weights}}\n",
    )
    config = _config(tmp_path, main_runner=runner)
    assert main(["config", "--dry-run", f"--config={config}"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("\nconfig error: dry run failed at prep_batch (train split): ")
    assert "ValueError: not enough values to unpack (expected 3, got 2)" in captured.err
    assert f"at {tmp_path / 'broken_prep_trainer.py'}:6, in prep_batch" in captured.err
    assert "Traceback" not in captured.err
    assert "[train split] one batch" in captured.out and "model_input:" not in captured.out
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "fields, stage",
    [
        ({"model_params": {"in_dim": 5}}, "forward (train split)"),
        (
            {
                "criterion_params": {
                    "dict_of_loss_params": {
                        "ce": {
                            "cls_name": TOY_LOSS,
                            "weight": 1.0,
                            "loss_params": {"src_name": "scores"},
                        }
                    }
                }
            },
            "loss (train split)",
        ),
        (
            {"val_metrics": {"acc": {"cls_name": "tests.toy.metric", "params": {"src_name": "x"}}}},
            "metric (valid split)",
        ),
    ],
)
def test_each_stage_is_named_when_it_fails(tmp_path, capsys, fields, stage):
    assert main(["config", "--dry-run", f"--config={_config(tmp_path, **fields)}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"\nconfig error: dry run failed at {stage}: ")
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_key_a_library_model_does_not_name_and_its_own_error_in_a_dry_run(tmp_path, capsys):
    pytest.importorskip("transformers")
    model = {"model_name": "tests.toy.hf_image_model"}
    config = _config(tmp_path, main_runner="tests.toy.bad_trainers.image_key", **model)
    assert main(["config", "--dry-run", f"--config={config}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("\nconfig error: dry run failed at forward (train split): ")
    if sys.version_info >= (3, 11):
        assert "Of the model_input keys ['img'] that prep_batch (" in err
        assert "; not ['img'], which its **kwargs took." in err
    # Three channels for one: the library's own line, named as such, then the task's.
    config = _config(tmp_path, main_runner="tests.toy.image_trainer", **model)
    assert main(["config", "--dry-run", f"--config={config}"]) == 2
    err = capsys.readouterr().err
    assert "ValueError: Make sure that the channel dimension" in err
    assert "raised inside transformers" in err and "resnet/modeling_resnet.py:" in err
    if sys.version_info >= (3, 11):
        assert "in the model built from model_name = 'tests.toy.hf_image_model' and" in err
        # model_params does not set it: the message speaks of the model's own default.
        assert "The message speaks of num_channels = 3, which model_params leaves at" in err


def test_a_task_s_own_step_runs_whole(tmp_path, capsys):
    runner = _toy_trainer_with(
        tmp_path,
        "own_step_trainer",
        "    def eval_step(self, engine, batch, split='valid'):\n"
        "        output = super().eval_step(engine, batch, split=split)\n"
        "        return {**output, 'y_pred': {**output['y_pred'], 'extra': batch[0][:, :2]}}\n",
    )
    config = _config(tmp_path, main_runner=runner)
    assert main(["config", "--dry-run", f"--config={config}"]) == 0
    out = capsys.readouterr().out
    valid = out[out.index("[valid split] one batch") :]
    assert "eval_step (the task's own) output: {logits: float32[16, 3], extra: float32[16, 2]}" in (
        valid
    )
    assert "valid/acc: " in valid
