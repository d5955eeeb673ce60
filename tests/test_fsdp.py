"""FSDP2 and sharded checkpoints, for real: 2 gloo ranks on the CPU, killed, resumed, reshaped.

Each test runs `gatle-ignite` in subprocesses on the toy task with `strategy = "fsdp"`, its two
Linear layers sharded as units, and checks what a user would: weights, files, exit codes.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gatle_ignite.run.loading import load_checkpoint_file
from gatle_ignite.run.sharded import ShardedCheckpoint
from tests.conftest import HANG_S, ROOT, child_env
from tests.toy.config_file import write_toy_config

pytestmark = pytest.mark.slow

TWO = ["nproc_per_node=2", "dist_backend='gloo'", "auto_model_params.sync_bn=False"]
ONE = ["nproc_per_node=1"]
FSDP = {
    "main_runner": "tests.toy.dist_trainer",
    "strategy": "fsdp",
    "fsdp_params": {"wrap": ["Linear"]},
    "max_epochs": 3,
    "save_every_iters": 1,
    "model_params": {"dropout": 0.3},
    "train_ds_params": {"n": 64, "bs": 16, "shuffle": True},
    "lr_scheduler": "gatle_ignite.schedulers.warmup_cosine",
    # Clipping on the shards must use the whole model's norm, as under DDP.
    "grad_clip_norm": 0.5,
}


def _config(tmp_path, name, **fields) -> str:
    fields = {**FSDP, "save_dir": str(tmp_path / name), **fields}
    return write_toy_config(tmp_path / f"{name}.py", **fields)


def _args(command, config, overrides):
    return [sys.executable, "-m", "gatle_ignite", command, f"--config={config}"] + [
        f"--override={o}" for o in overrides
    ]


def _cli(command, config, *overrides, topology=TWO, extra=()):
    done = subprocess.run(
        [*_args(command, config, (*topology, *overrides)), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _start(config, *overrides, topology=TWO):
    return subprocess.Popen(
        _args("train", config, (*topology, *overrides)),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        start_new_session=True,
    )


def _after_lines(process, text, count):
    seen, lines = 0, []
    for line in process.stdout:
        lines.append(line)
        seen += line.count(text)  # ranks' lines can share one
        if seen >= count:
            return
    raise AssertionError("the run ended first:\n" + "".join(lines[-30:]))


def _after_progress_lines(process, count):
    _after_lines(process, " TRAIN epoch ", count)


def _kill(process, signum=signal.SIGKILL):
    os.killpg(process.pid, signum)
    process.communicate(timeout=HANG_S)


def _weights(save_dir: Path) -> dict:
    return torch.load(save_dir / "final_weights.pt", weights_only=True)


def _identical(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _probes(save_dir: Path) -> list:
    return [json.loads((save_dir / f"probe_rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    _cli("train", _config(tmp, "ref"))
    return _weights(tmp / "ref")


def test_fsdp_writes_sharded_checkpoints_and_matches_ddp(tmp_path, uninterrupted):
    save_dir = tmp_path / "ref"
    shutil.rmtree(save_dir, ignore_errors=True)
    ddp = _config(tmp_path, "ddp", strategy="ddp", fsdp_params={})
    _cli("train", ddp)
    from_ddp = _weights(tmp_path / "ddp")
    assert from_ddp.keys() == uninterrupted.keys()
    for key, value in from_ddp.items():
        assert torch.allclose(value, uninterrupted[key], atol=1e-5), key
    run = tmp_path / "fsdp"
    _cli("train", _config(tmp_path, "fsdp"))
    latest = run / "latest_epoch_checkpoint_3.dcp"
    assert latest.is_dir() and sorted(p.name for p in latest.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert not list(run.glob("*.pt")) or {p.name for p in run.glob("*.pt")} == {"final_weights.pt"}


def test_accumulation_reduces_gradients_only_at_the_window_end(tmp_path):
    _cli("train", _config(tmp_path, "acc", accum_steps=2, max_epochs=1, model_params={}))
    # 4 micro-batches, windows of 2: 2 optimizer steps, each reducing the 2 sharded units once.
    assert [p["reduce_scatter_calls"] for p in _probes(tmp_path / "acc")] == [4, 4]
    _cli("train", _config(tmp_path, "each", max_epochs=1, model_params={}))
    assert [p["reduce_scatter_calls"] for p in _probes(tmp_path / "each")] == [8, 8]


def test_sigkill_then_resume_at_the_same_world_size_is_bit_identical(tmp_path, uninterrupted):
    config = _config(tmp_path, "run")
    process = _start(config)
    _after_progress_lines(process, 5)
    _kill(process)
    _cli("train", config, "resume=True")
    assert _identical(uninterrupted, _weights(tmp_path / "run"))


def test_sigterm_saves_a_sharded_checkpoint_and_the_resume_is_bit_identical(
    tmp_path, uninterrupted
):
    # Sent while both ranks wait in iteration 6 (tests.toy.dist_trainer's gate), agreed at the
    # next step's check: the stop lands mid-epoch with a latest_iter file, however loaded the
    # machine.
    gate = tmp_path / "gate"
    config = _config(
        tmp_path, "run", save_every_iters=0, check_every=1, fault_gate_at=6, fault_gate=str(gate)
    )
    process = _start(config)
    _after_lines(process, "waiting at the gate", 2)
    os.killpg(process.pid, signal.SIGTERM)
    gate.touch()
    out = process.communicate(timeout=HANG_S)[0]
    assert process.returncode == 75, out[-3000:]
    assert list((tmp_path / "run").glob("latest_iter_checkpoint_*.dcp"))
    _cli("train", config, "resume=True")
    assert _identical(uninterrupted, _weights(tmp_path / "run"))


@pytest.mark.parametrize(("first", "then"), [(TWO, ONE), (ONE, TWO)])
def test_a_sharded_run_resumes_at_another_world_size(tmp_path, first, then):
    config = _config(tmp_path, "run", max_epochs=1, model_params={})
    _cli("train", config, topology=first)
    out = _cli("train", config, "resume=True", "max_epochs=2", topology=then)
    assert "RESUMING FROM" in out and "TRAIN epoch 2" in out
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (manifest["state"], manifest["trained_epoch"]) == ("completed", 2)


def test_eval_and_consolidate_give_the_sharded_metrics_at_any_world_size(tmp_path):
    config = _config(tmp_path, "run", max_epochs=2, model_params={})
    _cli("train", config)
    best = next((tmp_path / "run").glob("valid_best_result_checkpoint_*.dcp"))
    metric = [_eval_acc(config, best, topology) for topology in (TWO, ONE)]
    consolidated = tmp_path / "best.pt"
    subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "consolidate", str(best), str(consolidated)],
        cwd=ROOT,
        check=True,
        env=child_env(),
        capture_output=True,
    )
    state = torch.load(consolidated, weights_only=True)
    full = ShardedCheckpoint(best).get("model")
    assert all(torch.equal(state["model"][k], full[k]) for k in full)
    metric += [_eval_acc(config, consolidated, topology) for topology in (TWO, ONE)]
    metric.append(_eval_acc(config, consolidated, ONE, "strategy='ddp'"))
    assert len(set(metric)) == 1, metric


def _eval_acc(config, checkpoint, topology, *overrides) -> str:
    out = _cli("eval", config, *overrides, topology=topology, extra=[f"--ckpt={checkpoint}"])
    return next(line for line in out.splitlines() if line.startswith("valid/acc: "))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_kill_mid_sharded_save_leaves_the_previous_checkpoint_loadable(
    tmp_path, uninterrupted, asynchronous
):
    config = _config(tmp_path, "run", ballast_mb=96, async_save=asynchronous, n_saved=1)
    save_dir = tmp_path / "run"
    process = _start(config)
    _after_progress_lines(process, 3)
    while not [p for p in save_dir.iterdir() if ".partial-" in p.name]:
        assert process.poll() is None, "the run ended before a sharded write was seen"
        time.sleep(0.005)
    _kill(process)
    finished = sorted(save_dir.glob("latest_*.dcp"))
    assert finished, "the kill left no resumable checkpoint"
    for path in finished:
        load_checkpoint_file(path)  # complete: its metadata and every shard are there
    out = _cli("train", config, "resume=True")
    assert "RESUMING FROM" in out
    assert not [p for p in save_dir.iterdir() if ".partial-" in p.name]
    assert _identical(uninterrupted, _weights(save_dir))


def test_a_compiled_sharded_run_trains_and_evaluates_like_an_eager_one(tmp_path):
    eager = _config(tmp_path, "eager", max_epochs=1, model_params={})
    compiled = _config(tmp_path, "compiled", max_epochs=1, model_params={}, compile=True)
    _cli("train", eager)
    _cli("train", compiled)
    weights = [_weights(tmp_path / name) for name in ("eager", "compiled")]
    assert all(torch.allclose(weights[0][k], weights[1][k], atol=1e-5) for k in weights[0])
    latest = tmp_path / "compiled" / "latest_epoch_checkpoint_1.dcp"
    assert _eval_acc(eager, latest, TWO) == _eval_acc(compiled, latest, ONE)
