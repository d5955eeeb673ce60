"""async_save and activation checkpointing in one process: the same run, written or computed
another way, lands on the same files and weights."""

import json
from pathlib import Path

import pytest
import torch

from gatle_ignite.run import saving
from gatle_ignite.run.layout import checkpoint_files
from tests.toy.trainer import Trainer


def _fit(make_cfg, name, **fields):
    cfg = make_cfg(max_epochs=2, save_every_iters=1, n_saved=2, **fields)
    cfg.save_dir = str(Path(cfg.save_dir).parent / name)
    task = Trainer(0, cfg)
    task.fit()
    return task, Path(cfg.save_dir)


def _model_state(path: Path) -> dict:
    return torch.load(path, weights_only=True)["model"]


def test_async_saves_write_the_same_checkpoints_as_blocking_ones(make_cfg):
    _, blocking = _fit(make_cfg, "blocking")
    task, background = _fit(make_cfg, "background", async_save=True)
    assert task._writes is not None
    names = [p.name for p in checkpoint_files(blocking)]
    assert names == [p.name for p in checkpoint_files(background)]
    for name in names:
        a, b = _model_state(blocking / name), _model_state(background / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    manifest = json.loads((background / "run.json").read_text())
    assert {e["file"] for e in manifest["checkpoints"]} == set(names)
    assert manifest["state"] == "completed"


def test_a_failed_background_write_fails_the_run_instead_of_passing_silently(make_cfg, monkeypatch):
    def broken(obj, path):
        raise OSError("disk full")

    monkeypatch.setattr(saving, "save_atomically", broken)
    with pytest.raises(OSError, match="disk full"):
        _fit(make_cfg, "broken", async_save=True)


def test_activation_checkpointing_wraps_the_named_classes_and_changes_no_result(make_cfg):
    plain, _ = _fit(make_cfg, "plain")
    wrapped, _ = _fit(make_cfg, "wrapped", activation_checkpointing=["Linear"])
    names = {type(m).__name__ for m in wrapped.model.modules()}
    assert "CheckpointWrapper" in names
    a, b = plain.model.state_dict(), wrapped.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_activation_checkpointing_naming_no_class_of_the_model_is_a_config_error(make_cfg):
    from gatle_ignite import ConfigError

    with pytest.raises(ConfigError, match="no submodule of the model has a class named"):
        _fit(make_cfg, "typo", activation_checkpointing=["Blok"])
