"""GPU checks for gatle-ignite: one command, PASS/FAIL per check, on whatever GPUs are visible.

    python scripts/verify_gpu.py            # from the repository root

Checks: bf16 AMP (no GradScaler), fp16 AMP (a GradScaler), nccl training on this node,
cfg.compile=True training with a checkpoint round trip into an eager model, FSDP over nccl in
bf16 with a sharded checkpoint that consolidates, and telemetry (peak memory read from CUDA, the
FLOP count, MFU on a GPU in the peak table, a profiler trace with CUDA kernels). Each check
trains an example briefly (synthetic; sharded_lm for FSDP) in a temporary directory. A check the
machine cannot run (FSDP on one GPU) is skipped with its reason. Exits 0 only when no check
failed.
"""

import copy
import csv
import json
import math
import sys
import tempfile
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gatle_ignite.cli.consolidate import consolidate  # noqa: E402
from gatle_ignite.cli.launch import launch  # noqa: E402
from gatle_ignite.config.loader import load_config_from_file  # noqa: E402
from gatle_ignite.trainer.telemetry.devices import peak_tflops  # noqa: E402
from gatle_ignite.utils.checkpoints import find_latest_checkpoint  # noqa: E402

CONFIG = ROOT / "examples" / "synthetic" / "configs" / "synthetic_v0.py"
SHARDED_LM = ROOT / "examples" / "sharded_lm" / "configs" / "sharded_lm_v0.py"


class Skipped(Exception):
    """A check this machine cannot run; the message says why."""


def _config(save_dir, **fields):
    cfg = load_config_from_file(CONFIG)
    cfg.save_dir = str(save_dir)
    cfg.max_epochs = 2
    cfg.logger_name = []
    for key, value in fields.items():
        cfg[key] = value
    return cfg


def _trainer_cls():
    from examples.synthetic.trainer.synthetic_trainer import Trainer

    return Trainer


def check_bf16(tmp):
    task = _trainer_cls()(0, _config(tmp, amp_dtype="bf16"))
    task.fit()
    loss = task.engines["trainer"].state.metrics["train/loss_avg"]
    assert task.dtype == torch.bfloat16 and task.autocast_enabled, (task.dtype, "autocast off")
    assert task.scaler is None, "bf16 must not create a GradScaler"
    assert task.device.type == "cuda", task.device
    assert loss == loss and loss < 2.3, f"train/loss_avg {loss}"
    return f"loss {loss:.3f}, no GradScaler"


def check_fp16(tmp):
    task = _trainer_cls()(0, _config(tmp, amp_dtype="fp16"))
    task.fit()
    loss = task.engines["trainer"].state.metrics["train/loss_avg"]
    assert isinstance(task.scaler, torch.amp.GradScaler), "fp16 must create a GradScaler"
    state = torch.load(find_latest_checkpoint(tmp), weights_only=True)
    assert "scaler" in state, "the GradScaler state is not checkpointed"
    assert loss == loss and loss < 2.3, f"train/loss_avg {loss}"
    return f"loss {loss:.3f}, GradScaler scale {task.scaler.get_scale():.0f}"


def check_nccl(tmp):
    gpus = torch.cuda.device_count()
    cfg = _config(tmp, dist_backend="nccl", nproc_per_node=min(gpus, 2))
    if gpus < 2:
        # One GPU: still bring up an nccl world (of one rank) through ignite.
        import ignite.distributed as idist

        from gatle_ignite.cli.launch import run_task

        with idist.Parallel(backend="nccl", nproc_per_node=1) as parallel:
            parallel.run(run_task, cfg)
    else:
        launch(cfg)
    latest = find_latest_checkpoint(tmp)
    assert latest is not None and latest.name == "latest_epoch_checkpoint_2.pt", latest
    keys = torch.load(latest, weights_only=True)["model"].keys()
    assert not [k for k in keys if k.startswith("module.")], "DDP prefix leaked into the checkpoint"
    return f"{min(gpus, 2)} rank(s), checkpoint {latest.name}"


def check_compile(tmp):
    cfg = _config(tmp, compile=True)
    task = _trainer_cls()(0, cfg)
    task.fit()
    trained = task.engines["evaluator"].state.metrics["valid/acc"]
    state = torch.load(find_latest_checkpoint(tmp), weights_only=True)
    assert not [k for k in state["model"] if "_orig_mod" in k], "_orig_mod. in the checkpoint"
    eager = copy.deepcopy(cfg)
    eager.compile = False
    eager.run = True
    eager.load_from_ckpt = "latest"
    evaluated = _trainer_cls()(0, eager).evaluate()["valid/acc"]
    assert abs(evaluated - trained) < 1e-6, (evaluated, trained)
    resumed = copy.deepcopy(cfg)
    resumed.resume = True
    resumed.max_epochs = 3
    again = _trainer_cls()(0, resumed)
    again.fit()
    assert again.engines["trainer"].state.epoch == 3
    return f"valid/acc {trained:.4f} compiled, {evaluated:.4f} eager from its checkpoint"


def epoch_losses(save_dir):
    """``train/loss_avg`` of each epoch, from the run's metrics.csv."""
    with open(Path(save_dir) / "metrics.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["name"] == "train/loss_avg"]
    return [float(row["value"]) for row in sorted(rows, key=lambda row: int(row["epoch"]))]


def train_sharded_lm(tmp, **fields):
    """Train sharded_lm for 2 epochs with ``fields`` set; check that the loss falls and that
    the latest checkpoint is a .dcp directory consolidating into fp32 weights."""
    cfg = load_config_from_file(SHARDED_LM)
    cfg.save_dir = str(tmp / "run")
    cfg.max_epochs = 2
    cfg.logger_name = []
    for key, value in fields.items():
        cfg[key] = value
    launch(cfg)
    losses = epoch_losses(cfg.save_dir)
    uniform = math.log(cfg.model_params["vocab"])
    assert len(losses) == 2 and losses[1] < min(0.9 * losses[0], uniform), f"losses {losses}"
    latest = Path(cfg.save_dir) / "latest_epoch_checkpoint_2.dcp"
    assert latest.is_dir(), f"no sharded checkpoint {latest.name}"
    consolidate(latest, tmp / "latest.pt")
    weights = torch.load(tmp / "latest.pt", weights_only=True)["model"]
    # bf16 is the compute dtype; the sharded parameters the optimizer updates stay fp32.
    dtypes = sorted({str(value.dtype) for value in weights.values()})
    assert dtypes == ["torch.float32"], f"consolidated weights are {dtypes}"
    return f"train/loss_avg {losses[0]:.3f} -> {losses[1]:.3f}, {latest.name} consolidated, fp32"


def check_fsdp_bf16(tmp):
    gpus = torch.cuda.device_count()
    if gpus < 2:
        raise Skipped(f"{gpus} GPU visible; sharding over nccl needs 2")
    detail = train_sharded_lm(tmp, amp_dtype="bf16", dist_backend="nccl", nproc_per_node=2)
    return f"2 ranks, {detail}"


def perf_rows(save_dir):
    """``{epoch: {name: value}}`` of the perf/ rows in the run's metrics.csv."""
    rows = {}
    with open(Path(save_dir) / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["name"].startswith("perf/"):
                rows.setdefault(int(row["epoch"]), {})[row["name"]] = float(row["value"])
    return rows


# The synthetic MLP (64 -> 128 -> 10) on a batch of 64: forward, then backward without the
# input's gradient. A multiply-add is 2 FLOPs.
SYNTHETIC_FLOPS = 2 * 64 * (64 * 128 + 128 * 10) + 2 * 64 * (2 * 128 * 10 + 64 * 128)


def check_telemetry(tmp):
    profile = {"wait": 2, "warmup": 1, "active": 2}
    task = _trainer_cls()(0, _config(tmp, amp_dtype="bf16", profile=profile))
    task.fit()
    rows = perf_rows(tmp)
    assert sorted(rows) == [1, 2], f"perf/ records for epochs {sorted(rows)}"
    peak = rows[2]["perf/peak_memory_mb"]
    # The process's resident memory is over a GiB once CUDA is up; the MLP's tensors are MBs.
    assert 0 < peak < 256, f"perf/peak_memory_mb {peak}: not CUDA's allocator peak"
    flops = rows[1]["perf/flops_per_step"]
    assert flops == SYNTHETIC_FLOPS, f"perf/flops_per_step {flops}, expected {SYNTHETIC_FLOPS}"
    name, known = torch.cuda.get_device_name(0), peak_tflops(task.device, "bf16")
    if known is None:
        mfu = f"no MFU: {name!r} is not in the peak table"
    else:
        value = rows[2].get("perf/mfu")
        assert value is not None and 0 < value < 1, f"perf/mfu {value} on {name}"
        mfu = f"MFU {value:.2e} of {known} TFLOP/s bf16 ({name})"
    [trace] = (tmp / "profile").glob("*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = sum(1 for event in events if event.get("cat") == "kernel")
    assert kernels > 0, f"{trace.name} holds no CUDA kernel"
    return f"peak {peak:.1f} MB from CUDA, {flops:,} FLOPs a step, {mfu}, {kernels} kernels traced"


CHECKS = {
    "bf16 AMP": check_bf16,
    "fp16 AMP + GradScaler": check_fp16,
    "nccl training": check_nccl,
    "compile + checkpoint round trip": check_compile,
    "nccl + FSDP + bf16, sharded checkpoint": check_fsdp_bf16,
    "telemetry: peak memory, FLOPs, MFU, profiler trace": check_telemetry,
}


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL no CUDA device is visible: run this on a GPU machine")
        return 2
    print(
        f"torch {torch.__version__}, {torch.cuda.device_count()} GPU(s): "
        f"{torch.cuda.get_device_name(0)}"
    )
    failed = skipped = 0
    for name, check in CHECKS.items():
        with tempfile.TemporaryDirectory() as tmp:
            try:
                detail = check(Path(tmp))
                print(f"PASS {name}: {detail}")
            except Skipped as reason:
                skipped += 1
                print(f"SKIP {name}: {reason}")
            except Exception as error:  # a failed check must not stop the others
                failed += 1
                print(f"FAIL {name}: {error!r}")
                traceback.print_exc()
    print(f"{len(CHECKS) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
