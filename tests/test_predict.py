"""``gatle-ignite predict``: every sample of a split, in dataset order, in one file."""

import os
import re
import subprocess
import sys

import pytest
import torch

from gatle_ignite.cli.main import main
from gatle_ignite.cli.predict import _with_targets, flatten_output
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.directory import eval_checkpoint
from tests.conftest import HANG_S, ROOT
from tests.toy.config import toy_config
from tests.toy.config_file import write_toy_config
from tests.toy.data import make_dataset
from tests.toy.model import Model
from tests.toy.trainer import Trainer

# 37 does not divide by two ranks or by the batch of 16: every shard and batch edge is hit.
VALID = {"n": 37, "bs": 16, "seed": 1}
GLOO = ["--override=dist_backend='gloo'", "--override=auto_model_params.sync_bn=False"]


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    # The CLI puts the working directory on sys.path; syspath_prepend restores sys.path.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trained toy run and the config file that names it."""
    folder = tmp_path_factory.mktemp("predict")
    fields = {"save_dir": str(folder / "run"), "valid_ds_params": VALID}
    Trainer(0, toy_config(**fields)).fit()
    return write_toy_config(folder / "cfg.py", **fields), folder / "run"


def _direct_logits(save_dir):
    """The best checkpoint's model applied to the whole split at once, outside the framework."""
    _path, state = eval_checkpoint(save_dir, "best")
    model = Model()
    model.load_state_dict(state["model"])
    model.eval()
    features, labels = make_dataset(n=VALID["n"], seed=VALID["seed"]).tensors
    with torch.no_grad():
        return model(features)["logits"], labels


def test_predict_writes_every_sample_in_dataset_order(trained, tmp_path, capsys):
    config, save_dir = trained
    before = sorted(p.name for p in save_dir.iterdir())
    out = tmp_path / "preds" / "valid.pt"
    assert main(["predict", f"--config={config}", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert f"PREDICTIONS: {VALID['n']} samples of the valid split written to {out}" in stdout
    predictions = torch.load(out, weights_only=True)
    assert sorted(predictions) == ["logits"]
    expected, _labels = _direct_logits(save_dir)
    assert predictions["logits"].shape == expected.shape == (VALID["n"], 3)
    assert torch.allclose(predictions["logits"], expected, atol=1e-6)
    # Inference mode: the run directory is read, never written.
    assert sorted(p.name for p in save_dir.iterdir()) == before


def test_predicted_accuracy_is_what_eval_reports(trained, tmp_path, capsys):
    config, save_dir = trained
    assert main(["eval", f"--config={config}"]) == 0
    reported = re.search(r"^valid/acc: (\S+)$", capsys.readouterr().out, re.M).group(1)
    out = tmp_path / "valid.pt"
    assert main(["predict", f"--config={config}", "--out", str(out)]) == 0
    logits = torch.load(out, weights_only=True)["logits"]
    _expected, labels = _direct_logits(save_dir)
    correct = int((logits.argmax(dim=1) == labels).sum())
    # eval prints 5 significant digits.
    assert f"{correct / len(labels):.5g}" == reported
    assert 0 < correct < len(labels)


def test_the_latest_checkpoint_can_be_chosen(trained, tmp_path, capsys):
    config, save_dir = trained
    latest = tmp_path / "latest.pt"
    assert main(["predict", f"--config={config}", "--ckpt", "latest", "--out", str(latest)]) == 0
    assert f"LOADING CHECKPOINT: {save_dir}/latest_epoch_checkpoint_2.pt" in capsys.readouterr().out
    assert torch.load(latest, weights_only=True)["logits"].shape == (VALID["n"], 3)


@pytest.mark.parametrize(
    "split, phrase",
    [
        ("test", "split 'test' has no data: test_ds_name is not set"),
        ("probe", "split 'probe' has no data: probe_ds_name is not set"),
        ("train", "predict runs an evaluation split"),
    ],
)
def test_a_split_without_data_is_a_config_error(trained, tmp_path, capsys, split, phrase):
    config, _save_dir = trained
    out = tmp_path / "never.pt"
    assert main(["predict", f"--config={config}", "--split", split, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("\nconfig error: ") and phrase in err
    assert "The evaluation splits with data: valid." in err or split == "train"
    assert not out.exists()


def test_a_shuffled_split_is_refused(trained, tmp_path, capsys):
    config, _save_dir = trained
    shuffled = f"--override=valid_ds_params={dict(VALID, shuffle=True)!r}"
    out = tmp_path / "never.pt"
    assert main(["predict", f"--config={config}", shuffled, "--out", str(out)]) == 2
    assert "does not visit the split in dataset order" in capsys.readouterr().err
    assert not out.exists()


def test_with_targets_writes_the_labels_and_sample_indices_beside_the_outputs(
    trained, tmp_path, capsys
):
    config, save_dir = trained
    assert main(["eval", f"--config={config}"]) == 0
    reported = re.search(r"^valid/acc: (\S+)$", capsys.readouterr().out, re.M).group(1)
    out = tmp_path / "valid.pt"
    assert main(["predict", f"--config={config}", "--out", str(out), "--with-targets"]) == 0
    stdout = capsys.readouterr().out
    assert "  targets.labels: [37] int64" in stdout and "  index: [37] int64" in stdout
    predictions = torch.load(out, weights_only=True)
    assert sorted(predictions) == ["index", "logits", "targets.labels"]
    _features, labels = make_dataset(n=VALID["n"], seed=VALID["seed"]).tensors
    assert torch.equal(predictions["targets.labels"], labels)
    assert torch.equal(predictions["index"], torch.arange(VALID["n"]))
    # A confusion matrix from the file alone, without rebuilding the split.
    confusion = torch.zeros(3, 3, dtype=torch.long)
    pairs = (predictions["targets.labels"], predictions["logits"].argmax(dim=1))
    confusion.index_put_(pairs, torch.ones(VALID["n"], dtype=torch.long), accumulate=True)
    assert int(confusion.sum()) == VALID["n"]
    assert f"{int(confusion.trace()) / VALID['n']:.5g}" == reported


def test_with_targets_refuses_an_output_that_takes_their_names():
    rows = {"index": torch.zeros(4), "logits": torch.zeros(4, 3)}
    with pytest.raises(ConfigError, match=r"output keys \['index'\]"):
        _with_targets(rows, {"model_input": {}, "targets": {"labels": torch.zeros(4)}})


def test_nested_outputs_are_flattened_to_dotted_keys():
    rows = torch.zeros(4, 2)
    flat = flatten_output({"logits": rows, "heads": {"a": rows, "b": [rows, rows[:, 0]]}})
    assert sorted(flat) == ["heads.a", "heads.b.0", "heads.b.1", "logits"]
    assert flat["heads.b.1"].shape == (4,)
    assert sorted(flatten_output(rows)) == ["y_pred"]


@pytest.mark.parametrize("output", [{"aux": torch.tensor(1.0)}, {"aux": 1.0}])
def test_an_output_without_a_row_per_sample_is_refused(output):
    with pytest.raises(ConfigError, match="'aux'"):
        flatten_output(output)


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR")}
    done = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_two_processes_write_the_one_process_predictions(trained, tmp_path):
    config, save_dir = trained
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    _cli("predict", f"--config={config}", f"--out={one}", "--override=nproc_per_node=1", *GLOO)
    two_ranks = ["--override=nproc_per_node=2", "--with-targets"]
    out = _cli("predict", f"--config={config}", f"--out={two}", *two_ranks, *GLOO)
    assert out.count("PREDICTIONS: ") == 1
    single = torch.load(one, weights_only=True)["logits"]
    written = torch.load(two, weights_only=True)
    double = written["logits"]
    # Each rank's sample indices, joined in rank order: the dataset's order, once each.
    assert torch.equal(written["index"], torch.arange(VALID["n"]))
    _features, labels = make_dataset(n=VALID["n"], seed=VALID["seed"]).tensors
    assert torch.equal(written["targets.labels"], labels)
    expected, _labels = _direct_logits(save_dir)
    # Two ranks of 19 and 18 samples, joined in rank order: no padded duplicate, none missing.
    assert double.shape == single.shape == (VALID["n"], 3)
    assert torch.allclose(double, single, atol=1e-6)
    assert torch.allclose(double, expected, atol=1e-6)
