"""Compile: in place, refused where dynamo would skip, "auto", and clean checkpoints."""

import copy
import random
import shutil
import sys

import numpy as np
import pytest
import torch
from ignite.engine import Events
from ml_collections import ConfigDict
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gatle_ignite.enhancements.compile as compile_mod
from gatle_ignite import ConfigError
from gatle_ignite.enhancements.compile import (
    _would_be_skipped,
    check_build_model_override,
    check_compile_value,
    compile_built_model,
    compile_model,
    is_compiled,
    resolve_compile,
)
from gatle_ignite.utils.checkpoints import find_best_checkpoint, find_latest_checkpoint, score_of
from tests.toy.model import Model
from tests.toy.trainer import Trainer

EAGER = {"backend": "eager"}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Every test compiles fresh models; keep dynamo's caches (and recompile limit) per test.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _cfg(**fields):
    return ConfigDict(fields)


def _sequential():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


def _same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- _would_be_skipped ----


def test_a_bare_sequential_would_be_skipped():
    assert _would_be_skipped(_sequential()) is True


def test_a_user_subclass_would_not_be_skipped():
    assert _would_be_skipped(Model()) is False


def test_ddp_would_be_skipped():
    # Only the type's forward is checked, so an uninitialised instance is enough.
    assert _would_be_skipped(DistributedDataParallel.__new__(DistributedDataParallel)) is True


def test_without_dynamos_trace_rules_nothing_is_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch._dynamo.trace_rules", None)
    assert _would_be_skipped(_sequential()) is False


# ---- compile_model ----


def test_compile_model_refuses_a_sequential():
    model = _sequential()
    with pytest.raises(ConfigError) as info:
        compile_model(model, EAGER)
    message = str(info.value)
    assert "cfg.compile" in message and "Sequential" in message
    assert "nn.Module subclass" in message
    assert "torch.nn.modules.container.Sequential" in message
    assert not is_compiled(model)


def test_compile_model_compiles_in_place_and_returns_the_same_object():
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(5, 8)
    expected = model(x)["logits"]
    out = compile_model(model, EAGER)
    assert out is model and type(out) is Model
    assert not isinstance(out, torch._dynamo.eval_frame.OptimizedModule)
    assert is_compiled(model)
    assert not any(k.startswith("_orig_mod") for k in model.state_dict())
    assert torch.allclose(model(x)["logits"], expected)


def test_compile_model_passes_the_params_to_module_compile():
    model = Model()
    calls = []
    model.compile = lambda *args, **kwargs: calls.append((args, kwargs))
    compile_model(model, ConfigDict({"backend": "eager", "dynamic": False}))
    assert calls == [((), {"backend": "eager", "dynamic": False})]
    compile_model(model)
    assert calls[-1] == ((), {})


# ---- is_compiled ----


def test_is_compiled_for_in_place_compile():
    model = Model()
    assert not is_compiled(model)
    model.compile(**EAGER)
    assert is_compiled(model)


def test_torch_compile_wrapper_is_not_compiled_in_place():
    wrapped = torch.compile(Model(), **EAGER)
    assert isinstance(wrapped, torch._dynamo.eval_frame.OptimizedModule)
    assert not is_compiled(wrapped)


def test_a_compiled_submodule_under_an_eager_top_is_not_compiled():
    model = Model()
    model.net.compile(**EAGER)
    assert is_compiled(model.net)
    assert not is_compiled(model)


class Wrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.module = inner


class PlainWrapper:
    """Not a Module: only ``.module``."""

    def __init__(self, inner):
        self.module = inner


def test_a_wrapper_around_a_compiled_model_is_compiled():
    model = Model()
    model.compile(**EAGER)
    assert is_compiled(Wrapper(model))
    assert is_compiled(Wrapper(Wrapper(model)))
    assert is_compiled(PlainWrapper(model))
    assert not is_compiled(Wrapper(Model()))


def test_is_compiled_ignores_a_module_attribute_without_state_dict():
    class Holder:
        module = "not a model"

    assert not is_compiled(Holder())


def test_is_compiled_stops_on_self_reference_and_depth():
    class Loop:
        pass

    loop = Loop()
    loop.module = loop
    assert is_compiled(loop) is False
    model = Model()
    model.compile(**EAGER)
    deep = model
    for _ in range(20):
        deep = PlainWrapper(deep)
    assert is_compiled(deep) is False


# ---- check_compile_value / resolve_compile ----


@pytest.mark.parametrize("value", [None, True, False, "auto"])
def test_valid_compile_values_pass(value):
    check_compile_value(_cfg(compile=value))


def test_a_missing_compile_field_passes():
    check_compile_value(_cfg())
    assert resolve_compile(_cfg()) is False


@pytest.mark.parametrize("value", ["yes", "on", 1, 0, "AUTO", "true"])
def test_other_compile_values_are_refused(value):
    with pytest.raises(ConfigError) as info:
        check_compile_value(_cfg(compile=value))
    message = str(info.value)
    assert "cfg.compile must be True, False" in message and repr(value) in message
    with pytest.raises(ConfigError, match="must be True, False"):
        resolve_compile(_cfg(compile=value))


@pytest.mark.parametrize("value, expected", [(None, False), (False, False), (True, True)])
def test_resolve_compile_plain_values(value, expected, capsys):
    assert resolve_compile(_cfg(compile=value)) is expected
    assert "[compile]" not in capsys.readouterr().out


def test_resolve_compile_auto_on_cpu_is_off(capsys):
    assert resolve_compile(_cfg(compile="auto")) is False
    out = capsys.readouterr().out
    assert "[compile] auto -> OFF" in out and "no accelerator" in out


def test_resolve_compile_auto_on_an_accelerator_is_on(monkeypatch, capsys):
    monkeypatch.setattr(
        "gatle_ignite.enhancements.compile.idist.device", lambda: torch.device("cuda")
    )
    assert resolve_compile(_cfg(compile="auto")) is True
    out = capsys.readouterr().out
    assert "[compile] auto -> ON (cuda, torch " in out and torch.__version__ in out


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_resolve_compile_auto_consumes_no_random_numbers():
    for seed in (0, 1234):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        resolve_compile(_cfg(compile="auto"))
        after = _draws()
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        untouched = _draws()
        assert after[:2] == untouched[:2] and torch.equal(after[2], untouched[2])
        assert torch.initial_seed() == seed


def test_initial_weights_under_auto_equal_those_under_false(make_cfg):
    auto = Trainer(0, make_cfg(compile="auto")).setup().model
    eager = Trainer(0, make_cfg(compile=False)).setup().model
    assert not is_compiled(auto)
    assert _same_state(auto.state_dict(), eager.state_dict())


# ---- compile_built_model ----


def _force_on(monkeypatch):
    monkeypatch.setattr("gatle_ignite.enhancements.compile.resolve_compile", lambda cfg: True)


def test_auto_on_an_accelerator_skips_a_sequential(monkeypatch, capsys):
    _force_on(monkeypatch)
    model = _sequential()
    assert compile_built_model(model, _cfg(compile="auto", compile_params=EAGER)) is False
    out = capsys.readouterr().out
    assert "[compile] auto -> OFF" in out and "Sequential" in out
    assert "dynamo would skip" in out
    assert not is_compiled(model)


def test_auto_on_an_accelerator_compiles_a_user_model(monkeypatch):
    _force_on(monkeypatch)
    model = Model()
    assert compile_built_model(model, _cfg(compile="auto", compile_params=EAGER)) is True
    assert is_compiled(model)


def test_compile_true_on_a_sequential_is_an_error():
    with pytest.raises(ConfigError, match="Sequential"):
        compile_built_model(_sequential(), _cfg(compile=True, compile_params=EAGER))


def test_compile_true_compiles_a_user_model():
    model = Model()
    assert compile_built_model(model, _cfg(compile=True, compile_params=EAGER)) is True
    assert is_compiled(model)


@pytest.mark.parametrize("value", [None, False, "auto"])
def test_compile_built_model_on_cpu_without_compiling(value):
    model = Model()
    assert compile_built_model(model, _cfg(compile=value, compile_params=EAGER)) is False
    assert not is_compiled(model)


def test_compile_built_model_uses_the_patched_resolve_compile(monkeypatch):
    monkeypatch.setattr(compile_mod, "resolve_compile", lambda cfg: False)
    model = Model()
    assert compile_built_model(model, _cfg(compile=True, compile_params=EAGER)) is False
    assert not is_compiled(model)


# ---- check_build_model_override ----


def _assert_override_message(info):
    message = str(info.value)
    assert "cfg.compile" in message and "does not consider compiled" in message
    assert "torch.compile(model)" in message and "self.encoder.compile()" in message
    assert "compile_model(model)" in message and "model.compile()" in message


def test_the_override_guard_fires_when_resolve_compile_is_on(monkeypatch):
    _force_on(monkeypatch)
    with pytest.raises(ConfigError) as info:
        check_build_model_override(Model(), None, _cfg(compile="auto"))
    _assert_override_message(info)


def test_the_override_guard_uses_the_given_decision():
    with pytest.raises(ConfigError, match="does not consider compiled"):
        check_build_model_override(Model(), True, _cfg(compile=None))
    # compiling=False is final: resolve_compile is not asked again.
    check_build_model_override(Model(), False, _cfg(compile=True))


def test_the_override_guard_passes_compiled_or_eager_models():
    model = Model()
    model.compile(**EAGER)
    check_build_model_override(model, True, _cfg(compile=True))
    check_build_model_override(Wrapper(model), None, _cfg(compile=True))
    check_build_model_override(Model(), None, _cfg(compile=None))
    check_build_model_override(Model(), None, _cfg(compile="auto"))


@pytest.mark.parametrize(
    "how", ["plain", "torch_compile", "submodule"], ids=["eager", "torch.compile", "encoder"]
)
def test_the_override_guard_refuses_what_does_not_count(how):
    model = Model()
    if how == "torch_compile":
        model = torch.compile(model, **EAGER)
    elif how == "submodule":
        model.net.compile(**EAGER)
    with pytest.raises(ConfigError, match="does not consider compiled"):
        check_build_model_override(model, None, _cfg(compile=True))


class IgnoringTrainer(Trainer):
    """A build_model override that ignores cfg.compile."""

    def build_model(self):
        return Model()


class CompilingTrainer(Trainer):
    """A build_model override that compiles through the framework helper."""

    def build_model(self):
        return compile_model(Model(), self.cfg.compile_params)


def test_a_trainer_override_that_ignores_compile_is_refused(make_cfg):
    with pytest.raises(ConfigError, match="does not consider compiled"):
        IgnoringTrainer(0, make_cfg(compile=True, compile_params=EAGER)).setup()


def test_a_trainer_override_under_forced_auto_is_refused(make_cfg, monkeypatch):
    _force_on(monkeypatch)
    with pytest.raises(ConfigError) as info:
        IgnoringTrainer(0, make_cfg(compile="auto", compile_params=EAGER)).setup()
    _assert_override_message(info)
    # Without the patch "auto" is off on CPU, so the same override is fine.
    monkeypatch.undo()
    IgnoringTrainer(0, make_cfg(compile="auto", compile_params=EAGER)).setup()


def test_a_trainer_override_that_compiles_trains(make_cfg):
    task = CompilingTrainer(0, make_cfg(compile=True, compile_params=EAGER, max_epochs=1)).fit()
    assert is_compiled(task.model)
    assert task.engines["trainer"].state.epoch == 1


# ---- training and checkpoints ----


def _model_keys(path):
    return list(torch.load(path, map_location="cpu")["model"])


def test_a_compiled_run_trains_with_clean_checkpoints(make_cfg):
    cfg = make_cfg(compile=True, compile_params=EAGER, max_epochs=1)
    task = Trainer(0, cfg).fit()
    assert type(task.model) is Model and is_compiled(task.model)
    assert task.engines["trainer"].state.epoch == 1
    eager_keys = list(Model().state_dict())
    for path in (
        find_latest_checkpoint(cfg.save_dir),
        find_best_checkpoint(cfg.save_dir, "valid_"),
    ):
        assert path is not None
        keys = _model_keys(path)
        assert keys == eager_keys
        assert not any("_orig_mod" in k for k in keys)


def test_a_sequential_model_with_compile_true_is_refused_by_the_trainer(make_cfg):
    class SequentialTrainer(Trainer):
        def build_model(self):
            model = nn.Sequential(nn.Linear(8, 3))
            self._compiling = compile_built_model(model, self.cfg)
            return model

    with pytest.raises(ConfigError, match="nn.Module subclass"):
        SequentialTrainer(0, make_cfg(compile=True, compile_params=EAGER)).setup()


def _source(make_cfg, tmp_path, compiled):
    save_dir = tmp_path / ("src_compiled" if compiled else "src_eager")
    cfg = make_cfg(
        save_dir=str(save_dir), compile=compiled, compile_params=EAGER, max_epochs=1, n_saved=None
    )
    task = Trainer(0, cfg).fit()
    assert is_compiled(task.model) is compiled
    latest = find_latest_checkpoint(save_dir)
    best = find_best_checkpoint(save_dir, prefix="valid_")
    assert latest is not None and best is not None
    return save_dir, latest, best


COMBOS = pytest.mark.parametrize(
    "src_compiled, dst_compiled",
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["eager->eager", "eager->compiled", "compiled->eager", "compiled->compiled"],
)


@COMBOS
def test_resume_between_compiled_and_eager(make_cfg, tmp_path, src_compiled, dst_compiled):
    src_dir, latest, _ = _source(make_cfg, tmp_path, src_compiled)
    saved = torch.load(latest, map_location="cpu")
    dst_dir = tmp_path / "resumed"
    shutil.copytree(src_dir, dst_dir)
    cfg = make_cfg(
        save_dir=str(dst_dir),
        resume=True,
        compile=dst_compiled,
        compile_params=EAGER,
        max_epochs=2,
        n_saved=None,
    )
    task = Trainer(0, cfg).setup()
    assert is_compiled(task.model) is dst_compiled
    seen = {}

    def snapshot(engine):
        seen["epoch"] = engine.state.epoch
        seen["model"] = copy.deepcopy(task.model.state_dict())
        seen["optimizer"] = copy.deepcopy(task.optimizer.state_dict())

    # STARTED fires inside run(), after fit() has loaded the resume state.
    task.engines["trainer"].add_event_handler(Events.STARTED, snapshot)
    task.fit()
    assert seen["epoch"] == 1
    assert _same_state(seen["model"], saved["model"])
    for index, state in saved["optimizer"]["state"].items():
        assert torch.equal(seen["optimizer"]["state"][index]["exp_avg"], state["exp_avg"])
    assert task.engines["trainer"].state.epoch == 2
    new_latest = dst_dir / "latest_epoch_checkpoint_2.pt"
    assert new_latest.exists()
    assert _model_keys(new_latest) == list(saved["model"])


@COMBOS
def test_eval_between_compiled_and_eager(make_cfg, tmp_path, src_compiled, dst_compiled, capsys):
    src_dir, latest, best = _source(make_cfg, tmp_path, src_compiled)
    for which, path in (("best", best), ("latest", latest)):
        cfg = make_cfg(save_dir=str(src_dir), compile=dst_compiled, compile_params=EAGER)
        cfg.run = True
        cfg.load_from_ckpt = which
        task = Trainer(0, cfg)
        results = task.evaluate()
        assert f"LOADING CHECKPOINT: {path}" in capsys.readouterr().out
        assert is_compiled(task.model) is dst_compiled
        saved = torch.load(path, map_location="cpu")["model"]
        assert _same_state(task.model.state_dict(), saved)
        # One epoch: best and latest hold the same weights, scored by the best file's name.
        assert results["valid/acc"] == pytest.approx(score_of(best), abs=1e-4)
