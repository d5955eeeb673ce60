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
from pathlib import Path

import pytest
import torch

from gatle_ignite.cli.main import main
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.export.verify import flat_tensors
from gatle_ignite.run.directory import eval_checkpoint
from gatle_ignite.run.loading import load_weights
from gatle_ignite.run.sharded import ShardedCheckpoint
from tests.conftest import HANG_S, ROOT, child_env
from tests.toy.config import toy_config
from tests.toy.config_file import write_toy_config
from tests.toy.model import Model as ToyModel

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


def _exported(capsys, config, fmt, out, *flags, overrides=()) -> tuple:
    """Export as the CLI does, expecting success: ``(what it printed, the model card)``."""
    capsys.readouterr()
    assert _export(config, list(overrides), fmt, out, *flags) == 0
    return capsys.readouterr().out, (out / "README.md").read_text()


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
    runner = importlib.import_module(fields.get("main_runner", "tests.toy.trainer"))
    runner.Trainer(0, toy_config(**fields)).fit()
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
    assert "BATCH: static, 16 rows: the model fixes the batch dimension" in stdout
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


def test_force_over_a_link_replaces_the_link_and_leaves_nothing_beside_it(tmp_path, capsys):
    """The link is what steps aside, and it is removed as a link: the directory it points to
    keeps its files, and no ``.exported.replaced-*`` stays behind."""
    config, _save_dir = _toy(tmp_path)
    elsewhere = tmp_path / "v1"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("mine")
    out = tmp_path / "exported"
    out.symlink_to(elsewhere, target_is_directory=True)
    assert _export(config, [], "pt2", out, "--force") == 0
    assert not out.is_symlink() and sorted(os.listdir(out)) == ["README.md", "model.pt2"]
    assert (elsewhere / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".exported.*"))


_STAGE_THEN = """
import os, signal, sys, time
from pathlib import Path
from gatle_ignite.export.directory import staged
with staged(Path(sys.argv[1])) as staging:
    (staging / "model.pt2").write_bytes(b"half")
    print(staging, flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
"""


def _staging_process(out, then: str):
    """A real process that is writing an export into ``out``'s staging directory: SIGKILLed
    there (``die``), or still at it (``live``). Returns it and its staging directory."""
    process = subprocess.Popen(
        [sys.executable, "-c", _STAGE_THEN, str(out), then],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    staging = Path(process.stdout.readline().strip())
    assert staging.parent == out.parent and staging.name.startswith(f".{out.name}.partial-")
    return process, staging


def test_an_export_removes_what_killed_exports_left_and_spares_a_live_one(tmp_path, capsys):
    config, _save_dir = _toy(tmp_path)
    live, live_staging = _staging_process(tmp_path / "other", "live")
    killed, dead_staging = _staging_process(tmp_path / "exported", "die")
    assert killed.wait(timeout=HANG_S) == -signal.SIGKILL
    # An old DIR set aside by a --force killed before removing it: its replacement is there.
    (tmp_path / "exported").mkdir()
    set_aside = tmp_path / ".exported.replaced-00000000-1-0a1b2c3d"
    set_aside.mkdir()
    # One whose replacement never came: the only copy left, kept.
    only_copy = tmp_path / ".gone.replaced-00000000-1-0a1b2c3d"
    only_copy.mkdir()
    try:
        assert dead_staging.is_dir() and live_staging.is_dir()
        capsys.readouterr()
        assert _export(config, [], "pt2", tmp_path / "exported", "--force") == 0
        out = capsys.readouterr().out
        assert f"REMOVED {dead_staging}: what an export killed before it finished left" in out
        assert not dead_staging.exists() and not set_aside.exists()
        assert live_staging.is_dir() and (live_staging / "model.pt2").read_bytes() == b"half"
        assert only_copy.is_dir()
    finally:
        live.kill()
        live.wait(timeout=HANG_S)


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


# ---- dimensions that vary in use: the sequence task ----


def _sequence_task(tmp_path, lengths=(8, 6), **model_params):
    """A trained run of tests.toy.seq_model, whose valid batches have ``lengths`` in turn."""
    loader = {"n": 32, "bs": 8, "lengths": list(lengths)}
    return _toy(
        tmp_path,
        main_runner="tests.toy.seq_trainer",
        model_name="tests.toy.seq_model",
        model_params=model_params,
        train_ds_name="tests.toy.seq_data",
        train_ds_params=loader,
        valid_ds_name="tests.toy.seq_data",
        valid_ds_params={**loader, "seed": 1},
    )


def _sequence(rows, length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 16, (rows, length), generator=generator)
    return {"ids": ids, "mask": torch.ones_like(ids)}


def _seq_model(save_dir, **params):
    return _best_model("tests.toy.seq_model", params, save_dir)


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_a_length_that_varies_between_batches_is_dynamic_and_checked_at_two_lengths(
    tmp_path, capsys, fmt
):
    config, save_dir = _sequence_task(tmp_path)
    out = tmp_path / "exported"
    stdout, card = _exported(capsys, config, fmt, out)
    # A pt2 program takes the range its guards take, 1 where it equals the eager model there;
    # an ONNX graph checks no sizes, so its card says the sizes it was checked at.
    taken = "takes 1 and up" if fmt == "pt2" else "checked at 1, 4 and 8"
    assert f"BATCH: dynamic (traced on 8 rows), {taken}" in stdout
    taken = "takes 1 to 12" if fmt == "pt2" else "checked at 1, 4 and 8"
    assert (
        f"DYNAMIC: ids dim 1 (with mask dim 1): traced at 8, {taken} (it varies between "
        f"the sampled batches)" in stdout
    )
    # The position table has 12 rows: a longer sequence would index past it.
    assert "BOUND: ids dim 1 at most 12: the position table pos.weight has 12 rows" in stdout
    assert f"CHECKED {FILE[fmt]} on a batch of 8: every output equals" in stdout
    assert f"CHECKED {FILE[fmt]} on a batch of 4: every output equals" in stdout
    assert f"CHECKED {FILE[fmt]} on ids dim 1 at 4, a batch of 8: every output equals" in stdout
    assert f"CHECKED {FILE[fmt]} on a batch of 1: every output equals" in stdout
    assert f"CHECKED {FILE[fmt]} on ids dim 1 at 1, a batch of 8: every output equals" in stdout
    model = _seq_model(save_dir)
    # Lengths and a batch the export never saw, the bound and the size of 1 included.
    for rows, length in [(3, 11), (5, 12), (2, 3), (1, 1)]:
        inputs = _sequence(rows, length)
        with torch.no_grad():
            _assert_same(fmt, _outputs(fmt, out, inputs), model(**inputs))
    if fmt == "pt2":
        dims = (
            "the batch: `ids` dim 0 and `mask` dim 0, 1 and up; `ids` dim 1 and `mask` dim 1, "
            "1 to 12 (the position table pos.weight has 12 rows)"
        )
    else:
        dims = (
            "the batch: `ids` dim 0 and `mask` dim 0, checked at 1, 4 and 8; `ids` dim 1 and "
            "`mask` dim 1, at most 12 (the position table pos.weight has 12 rows), checked at "
            "1, 4 and 8; the graph checks no sizes, others are untested"
        )
    assert f"| Dynamic dimensions | {dims} |" in card
    assert "ids dim 1 at 4, a batch of 8: max abs diff" in card
    if fmt == "pt2":
        program = torch.export.load(out / "model.pt2").module()
        with pytest.raises(Exception, match="<= 12"):
            program(**_sequence(2, 13))


def test_a_fixed_length_is_static_unless_the_config_or_the_flag_names_it(tmp_path, capsys):
    config, save_dir = _sequence_task(tmp_path, lengths=(8,))
    capsys.readouterr()
    assert _export(config, [], "pt2", tmp_path / "static") == 0
    assert "DYNAMIC:" not in capsys.readouterr().out
    static = torch.export.load(tmp_path / "static" / "model.pt2").module()
    with pytest.raises(Exception, match="8"):
        static(**_sequence(2, 5))
    named = ["export_params={'dynamic': {'ids': [1]}}"]
    assert _export(config, named, "pt2", tmp_path / "config") == 0
    assert "(named by export_params)" in capsys.readouterr().out
    assert _export(config, [], "onnx", tmp_path / "flag", "--dynamic", "ids=-1") == 0
    stdout = capsys.readouterr().out
    assert (
        "DYNAMIC: ids dim 1 (with mask dim 1): traced at 8, checked at 1, 4 and 8 (named by "
        in stdout
    )
    model = _seq_model(save_dir)
    inputs = _sequence(3, 5)
    with torch.no_grad():
        want = model(**inputs)
    _assert_same("pt2", _outputs("pt2", tmp_path / "config", inputs), want)
    _assert_same("onnx", _outputs("onnx", tmp_path / "flag", inputs), want)


def test_a_length_the_model_fixes_is_one_line_and_the_export_stays_static(tmp_path, capsys):
    config, _save_dir = _sequence_task(tmp_path, lengths=(8,), max_len=8, positions="fixed")
    stdout, card = _exported(capsys, config, "pt2", tmp_path / "exported", "--dynamic", "ids=1")
    assert "STATIC: ids dim 1 stays 8: the model fixes it (named by --dynamic)" in stdout
    assert "BATCH: dynamic (traced on 8 rows)" in stdout
    assert (
        "| Static dimensions | `ids` dim 1 = 8 (named by --dynamic): the model fixes them |" in card
    )


def _conv_task(tmp_path):
    data = {"n": 32, "in_dim": 16, "bs": 16}
    return _toy(
        tmp_path,
        main_runner="tests.toy.image_trainer",
        model_name="tests.toy.conv_model",
        train_ds_params=data,
        valid_ds_params={**data, "seed": 1},
    )


def _images(width: int) -> dict:
    return {"pixel_values": torch.randn(3, 1, 2, width, generator=torch.Generator().manual_seed(0))}


def _conv_exported(tmp_path, capsys, fmt: str) -> tuple:
    """The conv task exported with its width dynamic: ``(stdout, card, its model, out)``."""
    config, save_dir = _conv_task(tmp_path)
    out = tmp_path / "exported"
    stdout, card = _exported(capsys, config, fmt, out, "--dynamic", "pixel_values=3")
    return stdout, card, _best_model("tests.toy.conv_model", {}, save_dir), out


def test_the_pt2_range_is_where_its_guards_take_the_size_and_matches_what_it_runs(tmp_path, capsys):
    # Stride 4: an image 4 wide or less pools a map 1 wide, which the program's guards refuse.
    stdout, card, model, out = _conv_exported(tmp_path, capsys, "pt2")
    assert "DYNAMIC: pixel_values dim 3: traced at 8, takes 5 and up (named by --dynamic)" in stdout
    assert "REFUSED: pixel_values dim 3 at 4 and below: the program's Guard failed:" in stdout
    assert "CHECKED model.pt2 on pixel_values dim 3 at 16, a batch of 16: every output" in stdout
    assert "`pixel_values` dim 3, 5 and up; its guards refuse 4 and below (Guard failed:" in card
    program = torch.export.load(out / "model.pt2").module()
    # What the card says, for real: every width under 5 refused, every one from 5 computed.
    for width in range(1, 21):
        inputs = _images(width)
        if width < 5:
            with pytest.raises(Exception, match="Guard failed"):
                program(**inputs)
            continue
        with torch.no_grad():
            _assert_same("pt2", program(**inputs), model(**inputs))


def test_an_onnx_card_states_the_sizes_checked_and_no_pt2_guard(tmp_path, capsys):
    stdout, card, model, out = _conv_exported(tmp_path, capsys, "onnx")
    assert "DYNAMIC: pixel_values dim 3: traced at 8, checked at 1, 8 and 16 (named by " in stdout
    assert "CHECKED model.onnx on pixel_values dim 3 at 1, a batch of 16: every output" in stdout
    assert "Guard" not in card and "refuse" not in card
    assert (
        "`pixel_values` dim 3, checked at 1, 8 and 16; the graph checks no sizes, others are "
        "untested |" in card
    )
    # The graph keeps no guard: the widths the pt2 program refuses run, and are right.
    for width in (1, 2, 4, 7):
        inputs = _images(width)
        with torch.no_grad():
            _assert_same("onnx", _outputs("onnx", out, inputs), model(**inputs))


def test_a_dynamic_dimension_of_no_input_names_what_exists(tmp_path, capsys):
    config, _save_dir = _sequence_task(tmp_path, lengths=(8,))
    capsys.readouterr()
    out = tmp_path / "exported"
    assert _export(config, [], "pt2", out, "--dynamic", "input_ids=1") == 2
    err = capsys.readouterr().err
    assert "--dynamic names the input 'input_ids', which model_input does not hold." in err
    assert "model_input's tensors: ids [8, 8], mask [8, 8]." in err
    assert _export(config, [], "pt2", out, "--dynamic", "ids=2") == 2
    assert "--dynamic names dimension 2 of 'ids', which has 2 ([8, 8])." in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        _export(config, [], "pt2", out, "--dynamic", "ids")
    assert stopped.value.code == 2
    assert "'ids' is not KEY=DIM[,DIM...], e.g. input_ids=0,1" in capsys.readouterr().err
    assert _export(config, ["export_params={'dynamic': {'ids': 1}}"], "pt2", out) == 2
    assert "export_params must be a mapping such as" in capsys.readouterr().err
    assert _no_dir_left(out)


@pytest.mark.parametrize("output", ["dataclass", "model_output"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_model_returning_a_dataclass_or_a_model_output_exports_as_a_dict(
    tmp_path, capsys, output, fmt
):
    if output == "model_output":
        pytest.importorskip("transformers")
    # Trained returning a dict (the toy loss reads one); exported returning the other kind.
    config, save_dir = _sequence_task(tmp_path)
    out = tmp_path / "exported"
    assert _export(config, [f"model_params.output={output!r}"], fmt, out) == 0
    stdout = capsys.readouterr().out
    assert f"EXPORTED {fmt} to {out}" in stdout
    model = _seq_model(save_dir, output=output)
    inputs = _sequence(3, 5)
    with torch.no_grad():
        want = flat_tensors(model(**inputs))
    assert len(want) == 2
    got = _outputs(fmt, out, inputs)
    if fmt != "safetensors":
        assert f"CHECKED {FILE[fmt]} on ids dim 1 at 4, a batch of 8" in stdout
        # A plain dict: loading the program needs neither the model's code nor the library
        # that defined its output class.
        assert type(got) is dict
    _assert_same(fmt, flat_tensors(got), want)


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


def test_a_model_with_tied_weights_exports_them_and_its_card_says_so(tmp_path):
    config, save_dir = _sequence_task(tmp_path, tied=True)
    out = tmp_path / "exported"
    assert _export(config, [], "safetensors", out) == 0
    from safetensors.torch import load_file

    written = load_file(out / "model.safetensors")
    assert torch.equal(written["embed.weight"], written["unembed.weight"])
    card = (out / "README.md").read_text()
    assert "| Tied weights | `embed.weight` = `unembed.weight`: one tensor in the model" in card
    inputs = _sequence(3, 5)
    model = _seq_model(save_dir, tied=True)
    with torch.no_grad():
        _assert_same("safetensors", _outputs("safetensors", out, inputs), model(**inputs))


def test_a_model_param_named_like_a_secret_is_left_out_of_config_json_and_the_card_says_so(
    tmp_path,
):
    config, _save_dir = _sequence_task(tmp_path, hub_token="hf_abc123")
    out = tmp_path / "exported"
    assert _export(config, [], "safetensors", out) == 0
    assert "hf_abc123" not in (out / "config.json").read_text()
    card = (out / "README.md").read_text()
    assert "hf_abc123" not in card
    assert "| Not in config.json | `model_params.hub_token`: named like a secret" in card


def _card_snippet(card: str) -> str:
    return card.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_cards_loading_snippet_runs_as_pasted_and_computes_the_models_outputs(tmp_path, fmt):
    # A bool model param: config.json writes it `true`, which Python does not take.
    config, save_dir = _toy(tmp_path, model_params={"batchnorm": True, "dropout": 0.0})
    out = tmp_path / "exported"
    assert _export(config, [], fmt, out) == 0
    snippet = _card_snippet((out / "README.md").read_text())
    inputs, results = tmp_path / "inputs.pt", tmp_path / "outputs.pt"
    torch.save({"x": torch.randn(5, 8)}, inputs)
    # Where the card leaves the inputs to the reader (`x=...`, `"x": ...`), give them.
    filled = snippet.replace("x=...", "x=INPUTS['x']").replace('"x": ...', "\"x\": INPUTS['x']")
    assert "..." not in filled.split("#")[0]
    script = tmp_path / "snippet.py"
    script.write_text(
        f"import torch\nINPUTS = {{'x': torch.load({str(inputs)!r})['x'].numpy()}}\n"
        if fmt == "onnx"
        else f"import torch\nINPUTS = torch.load({str(inputs)!r})\n"
    )
    with script.open("a") as handle:
        handle.write(filled + f"\ntorch.save(outputs, {str(results)!r})\n")
    # Run from the repository root, as a user pasting it in a session there: `tests` imports.
    done = subprocess.run(
        [sys.executable, "-"],
        input=script.read_text(),
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    got = torch.load(results, weights_only=False)
    got = {"logits": torch.from_numpy(got[0])} if fmt == "onnx" else got
    model = _best_model("tests.toy.model", {"batchnorm": True, "dropout": 0.0}, save_dir)
    with torch.no_grad():
        _assert_same(fmt, got, model(**torch.load(inputs)))


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
    assert not out.exists() and list(tmp_path.glob(".exported.partial-*"))
    # The next export is not stopped by what the killed one left, and removes it.
    assert _export(config, [], "onnx", out) == 0
    assert (out / "model.onnx").is_file()
    assert not list(tmp_path.glob(".exported.*"))


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
