"""Gradient clipping applies to the accumulated, unscaled gradient."""

import copy

import torch

from tests.toy.trainer import Trainer


def _grad_norm(model):
    grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(grads)))


def test_norm_clipping_bounds_every_stepping_gradient(make_cfg):
    cfg = make_cfg(max_epochs=1, grad_clip_norm=1e-8, every_val=0, save_ckpt=False)
    task = Trainer(0, cfg).setup()
    norms = []
    original = task.backward

    def recording_backward(loss, step=True):
        original(loss, step=step)
        if step:
            norms.append(_grad_norm(task.model))

    task.backward = recording_backward
    task.fit()
    assert norms and max(norms) <= 1e-6


def test_value_clipping_bounds_every_element(make_cfg):
    cfg = make_cfg(max_epochs=1, grad_clip_value=1e-4, every_val=0, save_ckpt=False)
    task = Trainer(0, cfg).setup()
    peaks = []
    original = task.backward

    def recording_backward(loss, step=True):
        original(loss, step=step)
        peaks.append(max(float(p.grad.abs().max()) for p in task.model.parameters()))

    task.backward = recording_backward
    task.fit()
    assert max(peaks) <= 1e-4 + 1e-12


def test_clipping_with_a_grad_scaler_happens_after_unscale(make_cfg):
    """A scaled run must land where the unscaled one does; clipping scaled grads would not."""
    cfg = make_cfg(
        max_epochs=1,
        grad_clip_norm=0.01,
        every_val=0,
        save_ckpt=False,
        optimizer_name="gatle_ignite.optimizers.sgd",
        optimizer_params={"lr": 0.5, "momentum": 0.0, "nesterov": False},
        train_ds_params={"n": 32, "bs": 16, "shuffle": False},
    )
    plain = Trainer(0, cfg)
    plain.fit()
    scaled = Trainer(0, copy.deepcopy(cfg)).setup()
    scaled.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaled.fit()
    for key, value in plain.model.state_dict().items():
        assert torch.allclose(value, scaled.model.state_dict()[key], atol=1e-6), key
