"""Behaviour of the scheduler dispatch and the built-in schedulers (contract 9.1)."""

import io
import math
import pickle
import sys

import pytest
import torch
from ignite.engine import Engine, Events
from ignite.handlers import ReduceLROnPlateauScheduler

import gatle_ignite
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.schedulers import attach_scheduler, prep_scheduler
from gatle_ignite.schedulers._utils import base_lr, steps_per_epoch
from gatle_ignite.schedulers.warmup_cosine import MIN_WARMUP_EVENTS

LR = 1e-3
STEPS = 10


def _cfg(**fields):
    cfg = gatle_ignite.base_config()
    cfg.optimizer_params = {"lr": LR}
    for key, value in fields.items():
        cfg[key] = value
    return cfg


def _optimizer(lr=LR):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _engines():
    return {"trainer": Engine(lambda e, b: None), "evaluator": None}


def _lr(optimizer):
    return optimizer.param_groups[0]["lr"]


def _build(name, cfg, optimizer, train_dl=None):
    dl = list(range(STEPS)) if train_dl is None else train_dl
    return prep_scheduler(f"gatle_ignite.schedulers.{name}", cfg, dl, optimizer, _engines())


def _drive(scheduler, optimizer, calls):
    lrs = []
    for _ in range(calls):
        scheduler(None)
        lrs.append(_lr(optimizer))
    return lrs


def _weights_only_roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.fixture
def make_module(tmp_path, monkeypatch):
    """Write a throw-away module on sys.path; it is forgotten again after the test."""
    created = []

    def make(name, source):
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        created.append(name)
        return name

    yield make
    for name in created:
        sys.modules.pop(name, None)


# --- prep_scheduler ------------------------------------------------------------------------


def test_prep_scheduler_none_means_no_scheduling():
    assert prep_scheduler(None, _cfg(), [], _optimizer(), _engines()) == (None, "trainer", None)


def test_prep_scheduler_empty_string_fails_dispatch():
    with pytest.raises(ConfigError, match="empty module path"):
        prep_scheduler("", _cfg(), [], _optimizer(), _engines())


def test_prep_scheduler_missing_entrypoint_names_the_field():
    with pytest.raises(ConfigError, match="lr_scheduler") as info:
        prep_scheduler("gatle_ignite.schedulers._utils", _cfg(), [], _optimizer(), _engines())
    assert "must expose 'get_scheduler'" in str(info.value)


def test_prep_scheduler_unexpected_kwarg_becomes_config_error():
    cfg = _cfg(lr_scheduler_params={"bogus_param": 1})
    with pytest.raises(ConfigError, match="lr_scheduler_params not accepted by") as info:
        _build("step", cfg, _optimizer())
    assert "gatle_ignite.schedulers.step.get_scheduler" in str(info.value)
    assert "bogus_param" in str(info.value)


def test_prep_scheduler_passes_params_from_a_configdict():
    cfg = _cfg(lr_scheduler_params={"step_size": 3, "gamma": 0.5})
    scheduler, _, _ = _build("step", cfg, _optimizer())
    assert scheduler.lr_scheduler.step_size == 3
    assert scheduler.lr_scheduler.gamma == 0.5


def test_prep_scheduler_other_type_errors_propagate(make_module):
    name = make_module(
        "gi_sched_typeerror",
        "def get_scheduler(cfg, train_dl, optimizer, engines):\n"
        "    raise TypeError('something else went wrong')\n",
    )
    with pytest.raises(TypeError, match="something else"):
        prep_scheduler(name, _cfg(), [], _optimizer(), _engines())


@pytest.mark.parametrize("result", ["(None, 'trainer')", "[None, 'trainer', None]", "None"])
def test_prep_scheduler_requires_a_three_tuple(make_module, result):
    name = make_module(
        "gi_sched_badreturn",
        f"def get_scheduler(cfg, train_dl, optimizer, engines):\n    return {result}\n",
    )
    with pytest.raises(ConfigError, match="must return \\(scheduler, engine_name, event_name\\)"):
        prep_scheduler(name, _cfg(), [], _optimizer(), _engines())


def test_prep_scheduler_returns_a_custom_three_tuple(make_module):
    name = make_module(
        "gi_sched_custom",
        "def get_scheduler(cfg, train_dl, optimizer, engines, factor=1):\n"
        "    return ('sched', 'probe', factor)\n",
    )
    cfg = _cfg(lr_scheduler_params={"factor": 7})
    assert prep_scheduler(name, cfg, [], _optimizer(), _engines()) == ("sched", "probe", 7)


# --- attach_scheduler ----------------------------------------------------------------------


def _counter():
    calls = []

    def handler(engine):
        calls.append(engine.state.iteration)

    return handler, calls


def test_attach_scheduler_falsy_is_returned_unchanged():
    engines = {"trainer": Engine(lambda e, b: None)}
    assert attach_scheduler(None, "trainer", Events.ITERATION_STARTED, engines) is None
    assert attach_scheduler([], "nowhere", Events.ITERATION_STARTED, engines) == []


def test_attach_scheduler_unknown_engine_lists_sorted_keys():
    with pytest.raises(ConfigError, match="scheduler engine_name must be one of") as info:
        attach_scheduler(object(), "probe", Events.COMPLETED, _engines())
    assert "['evaluator', 'trainer']" in str(info.value)
    assert "'probe'" in str(info.value)


def test_attach_scheduler_engine_not_built():
    with pytest.raises(ConfigError, match="not built"):
        attach_scheduler(object(), "evaluator", Events.COMPLETED, _engines())


def test_attach_scheduler_attaches_one_and_returns_it():
    engines = _engines()
    handler, calls = _counter()
    assert attach_scheduler(handler, "trainer", Events.ITERATION_STARTED, engines) is handler
    engines["trainer"].run([0, 0, 0], max_epochs=1)
    assert calls == [1, 2, 3]


def test_attach_scheduler_attaches_each_of_a_list():
    engines = _engines()
    first, first_calls = _counter()
    second, second_calls = _counter()
    pair = [first, second]
    assert attach_scheduler(pair, "trainer", Events.EPOCH_COMPLETED, engines) is pair
    engines["trainer"].run([0, 0], max_epochs=2)
    assert first_calls == [2, 4]
    assert second_calls == [2, 4]


def test_attach_builtin_scheduler_runs_on_its_engine():
    cfg = _cfg(lr_scheduler_params={"step_size": 1, "gamma": 0.1}, max_epochs=3)
    optimizer = _optimizer()
    engines = _engines()
    scheduler, engine_name, event = prep_scheduler(
        "gatle_ignite.schedulers.step", cfg, list(range(STEPS)), optimizer, engines
    )
    attach_scheduler(scheduler, engine_name, event, engines)
    engines["trainer"].run(list(range(STEPS)), max_epochs=3)
    assert _lr(optimizer) == pytest.approx(LR * 0.01)


# --- _utils ---------------------------------------------------------------------------------


def test_steps_per_epoch_prefers_train_length():
    assert steps_per_epoch(_cfg(), list(range(STEPS))) == STEPS
    assert steps_per_epoch(_cfg(train_length=4), list(range(STEPS))) == 4


def test_base_lr_reads_optimizer_params_first():
    assert base_lr(_cfg(), _optimizer(lr=0.5)) == LR


def test_base_lr_falls_back_to_the_first_param_group():
    cfg = _cfg()
    cfg.optimizer_params = {"weight_decay": 0.1}
    assert base_lr(cfg, _optimizer(lr=0.5)) == 0.5


def test_base_lr_without_param_groups():
    class NoGroups:
        param_groups = []

    cfg = _cfg()
    cfg.optimizer_params = {}
    with pytest.raises(ConfigError, match="cannot determine a base learning rate"):
        base_lr(cfg, NoGroups())


# --- cosine ---------------------------------------------------------------------------------


def test_cosine_goes_from_base_lr_to_about_end_value():
    cfg = _cfg(lr_scheduler_params={"end_value": 1e-5}, max_epochs=2)
    optimizer = _optimizer(lr=0.5)
    scheduler, engine_name, event = _build("cosine", cfg, optimizer)
    assert (engine_name, event) == ("trainer", Events.ITERATION_STARTED)
    lrs = _drive(scheduler, optimizer, 2 * STEPS)
    assert lrs[0] == pytest.approx(LR)
    assert all(a > b for a, b in zip(lrs, lrs[1:]))
    assert 1e-5 < lrs[-1] < 0.02 * LR


def test_cosine_start_value_and_cycle_epochs():
    cfg = _cfg(
        lr_scheduler_params={"start_value": 0.1, "end_value": 0.0, "cycle_epochs": 1},
        max_epochs=3,
    )
    optimizer = _optimizer()
    scheduler, _, _ = _build("cosine", cfg, optimizer)
    lrs = _drive(scheduler, optimizer, 2 * STEPS)
    assert lrs[0] == pytest.approx(0.1)
    # a one-epoch cycle restarts at the start value on the next epoch
    assert lrs[STEPS] == pytest.approx(0.1)


def test_cosine_cycle_is_at_least_two_events():
    cfg = _cfg(train_length=1)
    scheduler, _, _ = _build("cosine", cfg, _optimizer())
    assert scheduler.cycle_size == 2


# --- step -----------------------------------------------------------------------------------


def test_step_first_call_applies_the_initial_value():
    cfg = _cfg(lr_scheduler_params={"step_size": 1, "gamma": 0.1})
    optimizer = _optimizer()
    scheduler, engine_name, event = _build("step", cfg, optimizer)
    assert (engine_name, event) == ("trainer", Events.EPOCH_COMPLETED)
    lrs = _drive(scheduler, optimizer, 3)
    assert lrs[0] == pytest.approx(LR)
    assert lrs[1] == pytest.approx(1e-4)
    # N calls, N-1 decays
    assert lrs[2] == pytest.approx(1e-5)


def test_step_defaults():
    scheduler, _, _ = _build("step", _cfg(), _optimizer())
    assert scheduler.lr_scheduler.step_size == 10
    assert scheduler.lr_scheduler.gamma == 0.1


# --- plateau --------------------------------------------------------------------------------


def test_plateau_without_metric_fails():
    with pytest.raises(ConfigError, match="plateau scheduler has no metric to watch"):
        _build("plateau", _cfg(), _optimizer())


def test_plateau_falls_back_to_score_name_and_targets_the_evaluator():
    scheduler, engine_name, event = _build("plateau", _cfg(score_name="valid/acc"), _optimizer())
    assert isinstance(scheduler, ReduceLROnPlateauScheduler)
    assert scheduler.metric_name == "valid/acc"
    assert (engine_name, event) == ("evaluator", Events.COMPLETED)


def test_plateau_defaults():
    scheduler, _, _ = _build("plateau", _cfg(score_name="valid/acc"), _optimizer())
    assert scheduler.scheduler.mode == "min"
    assert scheduler.scheduler.factor == 0.1
    assert scheduler.scheduler.patience == 10


def _evaluate(scheduler, value):
    evaluator = Engine(lambda e, b: None)
    evaluator.state.metrics = {"valid/acc": value}
    scheduler(evaluator)


def test_plateau_reduces_and_round_trips_through_weights_only_load():
    params = {"metric_name": "valid/acc", "mode": "min", "patience": 1, "factor": 0.5}
    cfg = _cfg(lr_scheduler_params=params)
    optimizer = _optimizer()
    scheduler, _, _ = _build("plateau", cfg, optimizer)
    for value in (1.0, 2.0):
        _evaluate(scheduler, value)
    assert _lr(optimizer) == pytest.approx(LR)
    assert scheduler.scheduler.num_bad_epochs == 1

    state = _weights_only_roundtrip(scheduler.state_dict())
    assert "_reduce_lr" not in state["scheduler"]
    assert state["scheduler"]["num_bad_epochs"] == 1

    fresh_optimizer = _optimizer()
    fresh, _, _ = _build("plateau", cfg, fresh_optimizer)
    fresh.load_state_dict(state)
    assert fresh.scheduler.num_bad_epochs == 1
    # the restored counter completes the patience: one more bad epoch halves the lr
    _evaluate(fresh, 3.0)
    assert _lr(fresh_optimizer) == pytest.approx(LR * 0.5)


def test_plain_ignite_plateau_state_would_not_load_weights_only():
    plain = ReduceLROnPlateauScheduler(_optimizer(), metric_name="valid/acc")
    with pytest.raises(pickle.UnpicklingError):
        _weights_only_roundtrip(plain.state_dict())


# --- warmup_cosine --------------------------------------------------------------------------


@pytest.mark.parametrize("warmup_epochs", [1, 3])
def test_warmup_cosine_peaks_at_the_end_of_warmup(warmup_epochs):
    cfg = _cfg(lr_scheduler_params={"warmup_epochs": warmup_epochs}, max_epochs=5)
    optimizer = _optimizer()
    scheduler, engine_name, event = _build("warmup_cosine", cfg, optimizer)
    assert (engine_name, event) == ("trainer", Events.ITERATION_STARTED)
    lrs = _drive(scheduler, optimizer, 5 * STEPS)
    peak = max(lrs)
    assert lrs.index(peak) == warmup_epochs * STEPS - 1
    assert peak == pytest.approx(LR)


def test_warmup_cosine_final_lr_follows_lr_scale_factor():
    cfg = _cfg(lr_scheduler_params={"lr_scale_factor": 0.5}, max_epochs=3)
    optimizer = _optimizer()
    scheduler, _, _ = _build("warmup_cosine", cfg, optimizer)
    lrs = _drive(scheduler, optimizer, 3 * STEPS)
    assert lrs[-1] == pytest.approx(LR * 0.5, rel=0.05)
    assert min(lrs[STEPS:]) >= LR * 0.5 * (1 - 1e-9)


def test_warmup_cosine_default_floor_first_and_last():
    cfg = _cfg(max_epochs=5)
    optimizer = _optimizer()
    scheduler, _, _ = _build("warmup_cosine", cfg, optimizer)
    lrs = _drive(scheduler, optimizer, cfg.max_epochs * STEPS)
    peak = max(lrs)
    assert lrs[0] < 0.5 * peak
    assert lrs[0] == pytest.approx(LR * 0.01)
    assert lrs[-1] < 0.05 * peak


def test_warmup_cosine_single_step_run_works():
    assert MIN_WARMUP_EVENTS == 2
    cfg = _cfg(train_length=1, max_epochs=1)
    optimizer = _optimizer()
    scheduler, _, _ = _build("warmup_cosine", cfg, optimizer)
    lrs = _drive(scheduler, optimizer, 3)
    assert all(math.isfinite(lr) and 0 < lr <= LR * (1 + 1e-9) for lr in lrs)
    assert lrs[MIN_WARMUP_EVENTS - 1] == pytest.approx(LR)


def test_warmup_cosine_uses_param_group_lr_without_configured_lr():
    cfg = _cfg(max_epochs=2)
    cfg.optimizer_params = {}
    optimizer = _optimizer(lr=0.2)
    scheduler, _, _ = _build("warmup_cosine", cfg, optimizer)
    lrs = _drive(scheduler, optimizer, STEPS)
    assert lrs[-1] == pytest.approx(0.2)


# --- state dicts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("cosine", {}),
        ("step", {}),
        ("plateau", {"metric_name": "valid/acc"}),
        ("warmup_cosine", {}),
    ],
)
def test_every_builtin_state_dict_loads_weights_only(name, params):
    cfg = _cfg(lr_scheduler_params=params, max_epochs=2)
    optimizer = _optimizer()
    scheduler, _, _ = _build(name, cfg, optimizer)
    if name == "plateau":
        _evaluate(scheduler, 1.0)
    else:
        _drive(scheduler, optimizer, 3)
    state = _weights_only_roundtrip(scheduler.state_dict())
    fresh, _, _ = _build(name, cfg, _optimizer())
    fresh.load_state_dict(state)
    assert _weights_only_roundtrip(fresh.state_dict()).keys() == state.keys()
