"""``gatle-ignite export``: each format is written, loaded back by its own library and computes
what the checkpoint's model computes; a model that cannot be exported, a failed check, a missing
package or a directory holding files leaves no DIR behind."""

import copy
import dataclasses
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gatle_ignite.cli.main import main
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.directory import eval_checkpoint
from gatle_ignite.run.loading import load_weights
from gatle_ignite.run.sharded import ShardedCheckpoint
from tests.conftest import HANG_S, ROOT, child_env
from tests.toy.config import toy_config
from tests.toy.config_file import write_toy_config
from tests.toy.model import Model as ToyModel
from tests.toy.trainer import Trainer

SYNTHETIC = ROOT / "examples" / "synthetic" / "configs" / "synthetic_v0.py"
CONTRASTIVE = ROOT / "examples" / "contrastive" / "configs" / "contrastive_v0.py"
EMA = ROOT / "examples" / "ema" / "configs" / "ema_v0.py"
FORMATS = ("safetensors", "pt2", "onnx")
FILE = {"safetensors": "model.safetensors", "pt2": "model.pt2", "onnx": "model.onnx"}


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    # The CLI puts the working directory on sys.path; syspath_prepend restores sys.path.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def _overrides(save_dir, *more) -> list:
    return [f"save_dir={str(save_dir)!r}", *more]


def _train(config, overrides) -> None:
    assert main(["train", f"--config={config}", *(f"--override={o}" for o in overrides)]) == 0


def _export(config, overrides, fmt, out, *flags) -> int:
    args = [f"--config={config}", *(f"--override={o}" for o in overrides)]
    return main(["export", *args, "--format", fmt, "--out", str(out), *flags])


def _no_dir_left(out) -> bool:
    """Neither ``out`` nor a staging directory beside it."""
    return not out.exists() and not list(out.parent.glob(f".{out.name}.*"))


def _best_model(model_name: str, model_params: dict, save_dir):
    """The best checkpoint's model, loaded outside the framework."""
    _path, state = eval_checkpoint(save_dir, "best")
    model = importlib.import_module(model_name).Model(**model_params)
    model.load_state_dict(state["model"])
    return model.eval()


def _outputs(fmt: str, out, inputs: dict) -> dict:
    """The exported artefact run by its own library, as a user would run it."""
    if fmt == "safetensors":
        from safetensors.torch import load_file

        rebuild = json.loads((out / "config.json").read_text())
        model = importlib.import_module(rebuild["model_name"]).Model(**rebuild["model_params"])
        model.load_state_dict(load_file(out / "model.safetensors"))
        with torch.no_grad():
            return model.eval()(**inputs)
    if fmt == "pt2":
        with torch.no_grad():
            return torch.export.load(out / "model.pt2").module()(**inputs)
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(out / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    names = [output.name for output in session.get_outputs()]
    results = session.run(names, {key: value.numpy() for key, value in inputs.items()})
    return {name: torch.from_numpy(result) for name, result in zip(names, results)}


def _assert_same(fmt: str, got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if fmt == "onnx":
            assert torch.allclose(got[key], value, atol=1e-4, rtol=1e-3), key
        else:
            assert torch.equal(got[key], value), key


# ---- the synthetic example and the contrastive one, through the CLI ----


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("synthetic") / "run"
    overrides = _overrides(save_dir, "max_epochs=1")
    _train(SYNTHETIC, overrides)
    return overrides, save_dir


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_synthetic_example_exports_what_its_best_checkpoint_computes(
    synthetic, tmp_path, capsys, fmt
):
    overrides, save_dir = synthetic
    out = tmp_path / "exported"
    assert _export(SYNTHETIC, overrides, fmt, out) == 0
    stdout = capsys.readouterr().out
    assert f"CHECKED {FILE[fmt]} on a batch of 64: every output equals the eager model's" in stdout
    assert "  logits: max abs diff " in stdout
    assert f"EXPORTED {fmt} to {out}" in stdout
    assert FILE[fmt] in os.listdir(out) and "README.md" in os.listdir(out)
    model = _best_model(
        "examples.synthetic.models.mlp", {"in_dim": 64, "hidden": 128, "n_classes": 10}, save_dir
    )
    # 37 rows: a batch size the export never saw, so the batch dimension is really dynamic.
    inputs = {"x": torch.randn(37, 64)}
    with torch.no_grad():
        _assert_same(fmt, _outputs(fmt, out, inputs), model(**inputs))
    card = (out / "README.md").read_text()
    manifest = json.loads((save_dir / "run.json").read_text())
    assert manifest["config_fingerprint"] in card and manifest["run_id"] in card
    assert "| Best score | `valid/acc` = " in card and "torch 2." in card


def test_the_safetensors_export_rebuilds_from_config_json_and_load_weights(synthetic, tmp_path):
    overrides, save_dir = synthetic
    out = tmp_path / "weights"
    assert _export(SYNTHETIC, overrides, "safetensors", out) == 0
    rebuild = json.loads((out / "config.json").read_text())
    assert rebuild == {
        "model_name": "examples.synthetic.models.mlp",
        "model_params": {"in_dim": 64, "hidden": 128, "n_classes": 10},
    }
    # safetensors writes its file for its owner alone; the export is as readable as its card.
    mode = (out / "README.md").stat().st_mode & 0o777
    assert (out / "model.safetensors").stat().st_mode & 0o777 == mode
    fresh = importlib.import_module(rebuild["model_name"]).Model(**rebuild["model_params"])
    load_weights(out / "model.safetensors", fresh)
    best = _best_model(rebuild["model_name"], rebuild["model_params"], save_dir)
    for key, value in best.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


@pytest.fixture(scope="module")
def contrastive(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("contrastive") / "run"
    small = ["train_ds_params.n=512", "valid_ds_params.n=256", "bank_ds_params.n=256"]
    overrides = _overrides(save_dir, "max_epochs=1", *small)
    _train(CONTRASTIVE, overrides)
    return overrides, save_dir


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_contrastive_example_exports_both_of_its_outputs(contrastive, tmp_path, capsys, fmt):
    overrides, save_dir = contrastive
    out = tmp_path / "exported"
    assert _export(CONTRASTIVE, overrides, fmt, out) == 0
    stdout = capsys.readouterr().out
    assert "  h1: max abs diff " in stdout and "  z1: max abs diff " in stdout
    params = {"in_dim": 64, "hidden": 256, "feat_dim": 128, "proj_dim": 32}
    model = _best_model("examples.contrastive.models.encoder", params, save_dir)
    inputs = {"x1": torch.randn(19, 64)}
    with torch.no_grad():
        want = model(**inputs)
    assert sorted(want) == ["h1", "z1"]
    _assert_same(fmt, _outputs(fmt, out, inputs), want)


# ---- the weights evaluation saw ----


def test_an_ema_task_exports_the_evaluated_weights_and_raw_ones_on_request(tmp_path, capsys):
    save_dir = tmp_path / "run"
    overrides = _overrides(save_dir, "max_epochs=1", "train_length=8")
    _train(EMA, overrides)
    capsys.readouterr()
    _path, state = eval_checkpoint(save_dir, "best")
    from safetensors.torch import load_file

    assert _export(EMA, overrides, "safetensors", tmp_path / "eval") == 0
    assert "WEIGHTS: eval, those the valid evaluation saw" in capsys.readouterr().out
    evaluated = load_file(tmp_path / "eval" / "model.safetensors")
    assert evaluated.keys() == state["ema"]["shadow"].keys()
    assert all(torch.equal(evaluated[k], v) for k, v in state["ema"]["shadow"].items())

    assert _export(EMA, overrides, "safetensors", tmp_path / "raw", "--weights", "raw") == 0
    assert "WEIGHTS: raw, the trained weights" in capsys.readouterr().out
    raw = load_file(tmp_path / "raw" / "model.safetensors")
    assert all(torch.equal(raw[k], v) for k, v in state["model"].items())
    assert any(not torch.equal(raw[k], evaluated[k]) for k in raw)
    assert "eval: those the valid evaluation saw" in (tmp_path / "eval" / "README.md").read_text()


# ---- the toy task: what cannot be exported, and what must not be left behind ----


def _toy(tmp_path, **fields):
    """A trained toy run and the config file that names it."""
    fields = {"save_dir": str(tmp_path / "run"), **fields}
    Trainer(0, toy_config(**fields)).fit()
    return write_toy_config(tmp_path / "cfg.py", **fields), tmp_path / "run"


@pytest.mark.parametrize("fmt", FORMATS)
def test_data_dependent_control_flow_is_a_clear_error_and_leaves_no_dir(tmp_path, capsys, fmt):
    branchy = {"model_name": "tests.toy.quirky_model", "model_params": {"quirk": "branch"}}
    config, _save_dir = _toy(tmp_path, **branchy)
    out = tmp_path / "exported"
    code = _export(config, [], fmt, out)
    err = capsys.readouterr().err
    if fmt == "safetensors":
        # Weights alone: nothing is traced, so a branch does not matter.
        assert code == 0, err
        return
    assert code == 2
    assert err.startswith("\nconfig error: export failed at torch.export")
    assert "GuardOnDataDependentSymNode" in err and "data-dependent control flow" in err
    assert "tests/toy/quirky_model.py:" in err and "in forward" in err
    assert f"Nothing was written to {out}." in err
    assert _no_dir_left(out)


def test_a_model_that_pins_the_batch_is_exported_with_a_static_one(tmp_path, capsys):
    pinned = {"model_name": "tests.toy.quirky_model", "model_params": {"quirk": "batch_of_16"}}
    config, _save_dir = _toy(tmp_path, **pinned)
    out = tmp_path / "exported"
    assert _export(config, [], "pt2", out) == 0
    stdout = capsys.readouterr().out
    assert "BATCH: static, 16 rows: the batch dimension cannot be dynamic (" in stdout
    assert stdout.count("CHECKED model.pt2 on a batch of 16") == 1
    program = torch.export.load(out / "model.pt2").module()
    assert program(x=torch.randn(16, 8))["logits"].shape == (16, 3)
    assert "| Batch dimension | static (16 rows) |" in (out / "README.md").read_text()


@pytest.mark.parametrize("fmt", ["safetensors", "pt2"])
def test_a_sharded_dcp_checkpoint_is_consolidated_on_the_way(tmp_path, capsys, fmt):
    # One process under strategy="fsdp" writes the sharded format, as several ranks do.
    config, save_dir = _toy(tmp_path, strategy="fsdp")
    best = next(save_dir.glob("valid_best_result_checkpoint_*.dcp"))
    out = tmp_path / "exported"
    assert _export(config, [], fmt, out) == 0
    assert f"CONSOLIDATED: the shards of {best.name}" in capsys.readouterr().out
    model = ToyModel()
    model.load_state_dict(ShardedCheckpoint(best).get("model"))
    inputs = {"x": torch.randn(5, 8)}
    with torch.no_grad():
        _assert_same(fmt, _outputs(fmt, out, inputs), model.eval()(**inputs))
    assert "sharded: consolidated" in (out / "README.md").read_text()


def _shifted(model):
    """A copy of ``model`` whose first weight is off by one: an export that went wrong."""
    wrong = copy.deepcopy(model)
    with torch.no_grad():
        next(wrong.parameters()).add_(1.0)
    return wrong


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_artefact_that_differs_from_the_eager_model_fails_and_leaves_no_dir(
    tmp_path, capsys, monkeypatch, fmt
):
    config, _save_dir = _toy(tmp_path)
    if fmt == "safetensors":
        from gatle_ignite.export import safetensors_export

        real = safetensors_export._weights
        monkeypatch.setattr(safetensors_export, "_weights", lambda model: real(_shifted(model)))
    else:
        module = importlib.import_module(f"gatle_ignite.export.{fmt}_export")
        real = module.trace

        def wrong_trace(source, *args):
            return real(dataclasses.replace(source, model=_shifted(source.model)), *args)

        monkeypatch.setattr(module, "trace", wrong_trace)
    out = tmp_path / "exported"
    assert _export(config, [], fmt, out) == 2
    err = capsys.readouterr().err
    assert f"export check failed ({FILE[fmt]}) on a batch of 16: 'logits' (max abs diff " in err
    assert f"Nothing was written to {out}." in err
    assert _no_dir_left(out)


def test_a_directory_holding_files_is_refused_unless_forced(tmp_path, capsys):
    config, _save_dir = _toy(tmp_path)
    out = tmp_path / "exported"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert _export(config, [], "pt2", out) == 2
    err = capsys.readouterr().err
    assert f"--out {out} already holds files: notes.txt." in err and "--force" in err
    assert (out / "notes.txt").read_text() == "mine"
    assert _export(config, [], "pt2", out, "--force") == 0
    assert sorted(os.listdir(out)) == ["README.md", "model.pt2"]
    assert not list(tmp_path.glob(".exported.*"))


def test_an_empty_directory_is_filled_and_a_file_is_refused(tmp_path, capsys):
    config, _save_dir = _toy(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _export(config, [], "safetensors", empty) == 0
    assert sorted(os.listdir(empty)) == ["README.md", "config.json", "model.safetensors"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert _export(config, [], "safetensors", afile) == 2
    assert f"--out {afile} is a file" in capsys.readouterr().err


def test_a_missing_package_is_a_config_error_naming_the_extra(tmp_path, capsys, monkeypatch):
    config, _save_dir = _toy(tmp_path)
    real = importlib.util.find_spec

    def without_onnxscript(name, *args):
        return None if name == "onnxscript" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_onnxscript)
    out = tmp_path / "exported"
    assert _export(config, [], "onnx", out) == 2
    err = capsys.readouterr().err
    assert "--format onnx needs onnxscript, which is not installed." in err
    assert 'pip install "gatle-ignite[export]"' in err
    assert _no_dir_left(out)


# ---- load_weights reads what safetensors export writes ----


def test_load_weights_refuses_a_damaged_safetensors_file(tmp_path):
    damaged = tmp_path / "model.safetensors"
    damaged.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    with pytest.raises(ConfigError, match="not a readable safetensors file"):
        load_weights(damaged, ToyModel())


def test_load_weights_names_the_extra_without_safetensors(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ConfigError, match=r"gatle-ignite\[export\]"):
        load_weights(tmp_path / "model.safetensors", ToyModel())


def test_tied_weights_are_written_under_every_name(tmp_path):
    from safetensors.torch import load_file, save_file

    from gatle_ignite.export.safetensors_export import _weights

    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False))
    model[1].weight = model[0].weight
    save_file(_weights(model), str(tmp_path / "tied.safetensors"))
    loaded = load_file(tmp_path / "tied.safetensors")
    assert sorted(loaded) == ["0.weight", "1.weight"]
    fresh = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False))
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh[1].weight, model[0].weight)


# ---- for real: a killed export, and a checkpoint two ranks wrote ----


def _export_process(config, out):
    command = [sys.executable, "-m", "gatle_ignite", "export", f"--config={config}"]
    return subprocess.Popen(
        [*command, "--format", "onnx", "--out", str(out)],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.slow
def test_an_export_killed_while_writing_leaves_no_dir(tmp_path):
    config, _save_dir = _toy(tmp_path)
    out = tmp_path / "exported"
    process = _export_process(config, out)
    while not list(tmp_path.glob(".exported.partial-*")):
        assert process.poll() is None, "the export ended before it was seen writing"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=HANG_S)
    assert not out.exists()
    # The next export is not stopped by what the killed one left.
    assert _export(config, [], "onnx", out) == 0
    assert (out / "model.onnx").is_file()


@pytest.mark.slow
def test_a_checkpoint_two_ranks_sharded_exports_in_one_process(tmp_path, capsys):
    fields = {
        "save_dir": str(tmp_path / "run"),
        "main_runner": "tests.toy.dist_trainer",
        "strategy": "fsdp",
        "fsdp_params": {"wrap": ["Linear"]},
        "nproc_per_node": 2,
        "dist_backend": "gloo",
    }
    config = write_toy_config(tmp_path / "cfg.py", **fields)
    done = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    best = next((tmp_path / "run").glob("valid_best_result_checkpoint_*.dcp"))
    assert sorted(p.name for p in best.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    out = tmp_path / "exported"
    # The config still says two processes; export runs in this one.
    assert _export(config, [], "safetensors", out) == 0
    from safetensors.torch import load_file

    full = ShardedCheckpoint(best).get("model")
    exported = load_file(out / "model.safetensors")
    assert exported.keys() == full.keys()
    assert all(torch.equal(exported[k], v) for k, v in full.items())
