"""Mixed precision: the dtype chosen per device, and a bf16 run on CPU."""

import math

import pytest
import torch

from gatle_ignite import ConfigError
from gatle_ignite.utils.amp import autocast_device_type, resolve_amp_dtype
from gatle_ignite.utils.checkpoints import find_latest_checkpoint
from tests.toy.trainer import Trainer


def _on(monkeypatch, device_type, bf16_supported=None):
    """Make the run's device ``device_type`` (looked up through amp's idist at call time)."""
    monkeypatch.setattr("gatle_ignite.utils.amp.idist.device", lambda: torch.device(device_type))
    if bf16_supported is not None:
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_supported)


def test_auto_on_cpu_is_fp32_without_autocast():
    assert resolve_amp_dtype("auto") == (torch.float32, False)
    assert resolve_amp_dtype() == (torch.float32, False)


def test_fp32_is_fp32_without_autocast():
    assert resolve_amp_dtype("fp32") == (torch.float32, False)


def test_bf16_autocasts_on_cpu():
    assert resolve_amp_dtype("bf16") == (torch.bfloat16, True)


def test_fp16_is_refused_off_cuda():
    with pytest.raises(ConfigError) as info:
        resolve_amp_dtype("fp16")
    message = str(info.value)
    assert "fp16" in message and "GradScaler" in message
    assert "'bf16'" in message and "'auto'" in message


@pytest.mark.parametrize("value", ["float8", "FP16", "bfloat16", None, ""])
def test_unknown_values_are_refused(value):
    with pytest.raises(ConfigError) as info:
        resolve_amp_dtype(value)
    message = str(info.value)
    assert "amp_dtype" in message
    assert "('auto', 'bf16', 'fp16', 'fp32')" in message
    assert f"got {value!r}" in message


def test_auto_on_cuda_with_bf16_support_is_bf16(monkeypatch):
    _on(monkeypatch, "cuda", bf16_supported=True)
    assert resolve_amp_dtype("auto") == (torch.bfloat16, True)


def test_auto_on_an_older_gpu_is_fp32(monkeypatch):
    _on(monkeypatch, "cuda", bf16_supported=False)
    assert resolve_amp_dtype("auto") == (torch.float32, False)


def test_auto_on_mps_is_fp32(monkeypatch):
    _on(monkeypatch, "mps", bf16_supported=True)
    assert resolve_amp_dtype("auto") == (torch.float32, False)


def test_fp16_on_cuda_autocasts(monkeypatch):
    _on(monkeypatch, "cuda", bf16_supported=True)
    assert resolve_amp_dtype("fp16") == (torch.float16, True)


def test_fp16_is_refused_on_mps(monkeypatch):
    _on(monkeypatch, "mps")
    with pytest.raises(ConfigError, match="fp16"):
        resolve_amp_dtype("fp16")


def test_explicit_choices_do_not_depend_on_the_gpu(monkeypatch):
    _on(monkeypatch, "cuda", bf16_supported=False)
    assert resolve_amp_dtype("fp32") == (torch.float32, False)
    assert resolve_amp_dtype("bf16") == (torch.bfloat16, True)


def test_the_device_is_probed_at_call_time(monkeypatch):
    assert resolve_amp_dtype("auto") == (torch.float32, False)
    _on(monkeypatch, "cuda", bf16_supported=True)
    assert resolve_amp_dtype("auto") == (torch.bfloat16, True)
    monkeypatch.undo()
    assert resolve_amp_dtype("auto") == (torch.float32, False)


def test_autocast_device_type_follows_the_run_device(monkeypatch):
    assert autocast_device_type() == "cpu"
    _on(monkeypatch, "cuda")
    assert autocast_device_type() == "cuda"


class RecordingTrainer(Trainer):
    """Records each step's loss and the dtype of the logits autocast produced."""

    def forward(self, model_input):
        out = super().forward(model_input)
        if self.model.training:
            self.seen_dtypes = getattr(self, "seen_dtypes", []) + [out["logits"].dtype]
        return out

    def backward(self, loss, step=True):
        self.losses = getattr(self, "losses", []) + [float(loss.detach())]
        super().backward(loss, step=step)


def test_a_bf16_run_on_cpu_trains_without_a_scaler(make_cfg, tmp_path):
    cfg = make_cfg(amp_dtype="bf16", max_epochs=1)
    task = RecordingTrainer(0, cfg)
    assert (task.dtype, task.autocast_enabled, task.device_type) == (
        torch.bfloat16,
        True,
        "cpu",
    )
    task.fit()
    assert task.scaler is None
    assert task.engines["trainer"].state.epoch == 1
    assert len(task.losses) == 4 and all(math.isfinite(v) for v in task.losses)
    # autocast really ran in bf16.
    assert set(task.seen_dtypes) == {torch.bfloat16}
    state = torch.load(find_latest_checkpoint(cfg.save_dir), map_location="cpu")
    assert "scaler" not in state
    # The weights stay fp32: autocast only changes the compute dtype.
    assert all(v.dtype == torch.float32 for v in state["model"].values())


def test_an_fp32_run_does_not_autocast(make_cfg):
    task = RecordingTrainer(0, make_cfg(amp_dtype="fp32", max_epochs=1)).fit()
    assert task.scaler is None
    assert set(task.seen_dtypes) == {torch.float32}


def test_an_auto_run_on_cpu_is_fp32_without_a_scaler(make_cfg):
    task = RecordingTrainer(0, make_cfg(amp_dtype="auto", max_epochs=1)).fit()
    assert task.scaler is None and task.autocast_enabled is False
    assert set(task.seen_dtypes) == {torch.float32}


def test_the_trainer_refuses_fp16_on_cpu(make_cfg):
    with pytest.raises(ConfigError, match="fp16"):
        Trainer(0, make_cfg(amp_dtype="fp16"))
