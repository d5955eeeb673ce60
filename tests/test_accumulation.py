"""Gradient accumulation: windows, step cadence, and equivalence with one large batch."""

import copy

import pytest
import torch
from ignite.engine import Engine

from tests.toy.trainer import Trainer


def _sgd(cfg):
    cfg.optimizer_name = "gatle_ignite.optimizers.sgd"
    cfg.optimizer_params = {"lr": 0.1, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0}
    return cfg


def _train_one_epoch(cfg):
    task = Trainer(0, cfg)
    task.fit()
    return {k: v.clone() for k, v in task.model.state_dict().items()}


@pytest.mark.parametrize("n_micro", [2, 4])
def test_micro_batches_land_on_the_same_weights_as_one_batch(make_cfg, n_micro):
    params = {"n": 64, "bs": 64, "shuffle": False}
    whole = _sgd(make_cfg(max_epochs=1, train_ds_params=params, every_val=0, save_ckpt=False))
    split = copy.deepcopy(whole)
    split.train_ds_params.bs = 64 // n_micro
    split.accum_steps = n_micro
    expected, got = _train_one_epoch(whole), _train_one_epoch(split)
    for key in expected:
        assert torch.allclose(expected[key], got[key], atol=1e-6), key


def test_a_backward_that_forgets_to_divide_would_differ(make_cfg):
    """The negative control: without the division the weights move N times as far."""
    params = {"n": 64, "bs": 64, "shuffle": False}
    whole = _sgd(make_cfg(max_epochs=1, train_ds_params=params, every_val=0, save_ckpt=False))
    split = copy.deepcopy(whole)
    split.train_ds_params.bs = 16
    split.accum_steps = 4
    expected = _train_one_epoch(whole)

    class Undivided(Trainer):
        def backward(self, loss, step=True):
            window = self._accum_window(self.engines["trainer"])[0]
            super().backward(loss * window, step=step)

    task = Undivided(0, split)
    task.fit()
    got = task.model.state_dict()
    assert not all(torch.allclose(expected[k], got[k], atol=1e-6) for k in expected)


def test_ten_batches_with_accum_four_step_after_4_8_10(make_cfg):
    cfg = make_cfg(
        max_epochs=1,
        accum_steps=4,
        every_val=0,
        save_ckpt=False,
        train_ds_params={"n": 40, "bs": 4, "shuffle": False},
    )
    task = Trainer(0, cfg).setup()
    steps, windows = [], []
    original_step = task.optimizer.step

    def counting_step(*args, **kwargs):
        steps.append(task.engines["trainer"].state.iteration)
        return original_step(*args, **kwargs)

    task.optimizer.step = counting_step
    original_window = task._accum_window

    def recording_window(engine):
        result = original_window(engine)
        windows.append(result[0])
        return result

    task._accum_window = recording_window
    task.fit()
    assert steps == [4, 8, 10]
    assert windows == [4, 4, 4, 4, 4, 4, 4, 4, 2, 2]


def test_accum_window_never_straddles_an_epoch(make_cfg):
    task = Trainer(0, make_cfg())
    task.accum_steps = 3
    engine = Engine(lambda e, b: None)
    engine.state.epoch_length = 5
    seen = []
    for iteration in range(1, 11):
        engine.state.iteration = iteration
        seen.append(task._accum_window(engine))
    first_epoch = [(3, True, False), (3, False, False), (3, False, True)]
    first_epoch += [(2, True, False), (2, False, True)]
    assert seen == first_epoch * 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_accum_steps_must_be_a_positive_int(make_cfg, bad):
    cfg = make_cfg()
    with cfg.ignore_type():
        cfg.accum_steps = bad
    with pytest.raises(Exception, match="accum_steps must be an integer >= 1"):
        Trainer(0, cfg).setup()


def test_an_overridden_train_step_with_accumulation_warns(make_cfg):
    class Custom(Trainer):
        def train_step(self, engine, batch, split="train"):
            return super().train_step(engine, batch, split=split)

    with pytest.warns(UserWarning, match="train_step") as record:
        Custom(0, make_cfg(accum_steps=2)).setup()
    assert any("accum_steps" in str(w.message) for w in record)


def test_no_warning_for_the_base_train_step(make_cfg, recwarn):
    Trainer(0, make_cfg(accum_steps=2)).setup()
    # By its words: another test's leaked file, collected here, may warn with its path.
    assert not [w for w in recwarn if "overrides train_step" in str(w.message)]
