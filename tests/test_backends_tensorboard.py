"""The tensorboard backend: event files read back with TensorBoard's own event reader."""

import os

import pytest

from tests.backend_fixtures import need, synthetic_cfg, tensorboard_series, train


def test_event_files_hold_every_scalar_at_its_step(tmp_path):
    need("tensorboard")
    cfg = synthetic_cfg(tmp_path / "run", ["tensorboard"])
    train(cfg)

    assert os.listdir(os.path.join(cfg.save_dir, "tensorboard"))
    # Epoch-level metrics sit at their epoch, iteration-level ones at their iteration.
    acc = tensorboard_series(cfg.save_dir, "valid/acc")
    assert [step for step, _ in acc] == [8, 16]
    assert all(0.0 <= value <= 1.0 for _, value in acc)
    assert [step for step, _ in tensorboard_series(cfg.save_dir, "train/loss_avg")] == [8, 16]
    lrs = tensorboard_series(cfg.save_dir, "train/lr_0")
    assert [step for step, _ in lrs] == [4, 8, 12, 16]
    # TensorBoard keeps float32.
    assert lrs[1][1] == pytest.approx(1e-3, rel=1e-6)
