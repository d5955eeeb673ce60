"""Real multi-process runs: 2 ranks on CPU with gloo, self-spawned, under torchrun and SLURM."""

import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch

from gatle_ignite.trainer.lifecycle import EXIT_DIVERGED
from tests.conftest import HANG_S, ROOT, free_port, no_process_left
from tests.toy.config import toy_config
from tests.toy.trainer import Trainer

# Each test starts real processes: slow, and bounded (HANG_S) so that a hang fails instead of
# blocking; never by how long they take.
pytestmark = pytest.mark.slow

GLOO = ["--override=dist_backend='gloo'", "--override=auto_model_params.sync_bn=False"]


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(key, None)
    env.update(extra)
    return env


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "gatle_ignite", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=env or _clean_env(),
    )


def _write_config(path, **fields):
    """A config file for the toy task with its probes, for a child process to load."""
    fields.setdefault("main_runner", "tests.toy.dist_trainer")
    path.write_text(
        "from tests.toy.config import toy_config\n\n\n"
        f"def get_config():\n    return toy_config(**{fields!r})\n"
    )
    return str(path)


def _probes(save_dir):
    return [json.loads((save_dir / f"probe_rank{r}.json").read_text()) for r in (0, 1)]


def _ok(done):
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_two_processes_train_the_synthetic_task(tmp_path):
    save_dir = tmp_path / "run"
    out = _ok(
        _cli(
            "train",
            "--config=examples/synthetic/configs/synthetic_v0.py",
            "--override=nproc_per_node=2",
            "--override=max_epochs=1",
            f"--override=save_dir={str(save_dir)!r}",
            "--override=main_runner='tests.toy.dist_trainer'",
            # Per-iteration points too rare to read the loss for the progress lines.
            "--override=log_every=100",
            # Every progress line, off a terminal too.
            "--override=progress_seconds=0",
            *GLOO,
        )
    )
    assert out.count("MODEL: ") == 1 and out.count("TRAINING COMPLETE after ") == 1
    assert out.count(" TRAIN epoch 1: ") == 10
    # Under DDP the loss is read every 64 iterations, and at each progress line: every line of
    # the first epoch (32 iterations) shows the loss of its own iteration.
    lines = [line for line in out.splitlines() if " TRAIN epoch 1: " in line]
    assert all(re.search(r"\| loss [\d.]+ \|", line) for line in lines), lines
    for probe in _probes(save_dir):
        # bs 64 is the total batch: 32 per rank; 2048 samples give each rank 32 batches.
        assert probe["train_batches"] == [32] * 32
        # The 512 validation samples are sharded exactly: 256 per rank.
        assert probe["eval_batches"] == [32] * 8
        assert probe["train_sampler"] == "DistributedSampler"
        assert probe["world_size"] == 2
    assert (save_dir / "latest_epoch_checkpoint_1.pt").exists()
    assert list(save_dir.glob("valid_best_result_checkpoint_1_*.pt"))


def _acc(out):
    return float(re.search(r"^valid/acc: (\S+)$", out, re.M).group(1))


def _valid_lines(out):
    return sorted(line for line in out.splitlines() if line.startswith("valid/"))


def test_evaluating_an_uneven_split_on_two_ranks_gives_the_one_process_metric(tmp_path):
    save_dir = tmp_path / "run"
    builtin = {
        name: {"cls_name": f"gatle_ignite.metrics.{name}", "params": params}
        for name, params in (
            ("f1", {}),
            ("loss", {"tgt_name": "labels"}),
            ("top_k_accuracy", {"k": 2}),
        )
    }
    fields = {
        "save_dir": str(save_dir),
        "valid_ds_params": {"n": 127, "bs": 16, "seed": 1},
        "val_metrics": {"acc": {"cls_name": "tests.toy.metric"}, **builtin},
    }
    Trainer(0, toy_config(max_epochs=2, **fields)).fit()
    config = _write_config(tmp_path / "cfg.py", main_runner="tests.toy.trainer", **fields)
    one = _ok(_cli("eval", f"--config={config}", "--override=nproc_per_node=1", *GLOO))
    two = _ok(_cli("eval", f"--config={config}", "--override=nproc_per_node=2", *GLOO))
    assert two.count("valid/acc: ") == 1
    assert _acc(two) == _acc(one)
    assert 0.0 < _acc(one) < 1.0
    # The built-in metrics too, each as eval prints it (5 significant digits).
    assert len(_valid_lines(one)) == 4
    assert _valid_lines(two) == _valid_lines(one)


def test_accumulation_under_ddp_matches_one_process_and_all_reduces_once_per_window(tmp_path):
    sgd = {
        "optimizer_name": "gatle_ignite.optimizers.sgd",
        "optimizer_params": {"lr": 0.1, "momentum": 0.0, "nesterov": False},
        "max_epochs": 1,
        "every_val": 0,
        "save_ckpt": False,
    }
    reference = Trainer(
        0, toy_config(save_dir=str(tmp_path / "ref"), train_ds_params={"n": 64, "bs": 32}, **sgd)
    )
    reference.fit()
    save_dir = tmp_path / "ddp"
    config = _write_config(
        tmp_path / "cfg.py",
        save_dir=str(save_dir),
        train_ds_params={"n": 64, "bs": 16},
        accum_steps=2,
        **sgd,
    )
    _ok(_cli("train", f"--config={config}", "--override=nproc_per_node=2", *GLOO))
    # 16 in total per micro-batch (8 per rank), windows of 2: one all-reduce per 32 samples.
    assert [p["allreduce_calls"] for p in _probes(save_dir)] == [2, 2]
    got = torch.load(save_dir / "final_weights.pt", weights_only=True)
    for key, value in reference.model.state_dict().items():
        assert torch.allclose(value, got[key], atol=1e-6), key


def test_a_nan_loss_on_one_rank_stops_every_rank_at_that_iteration(tmp_path):
    save_dir = tmp_path / "run"
    config = _write_config(
        tmp_path / "cfg.py",
        save_dir=str(save_dir),
        max_epochs=3,
        fault_nan_rank=1,
        fault_nan_from=3,
        check_every=1,
    )
    done = _cli("train", f"--config={config}", "--override=nproc_per_node=2", *GLOO)
    # The parent says it once, from run.json, with the diverged run's own exit code.
    assert done.returncode == EXIT_DIVERGED, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("TRAINING DIVERGED (non-finite loss at iteration 3)") == 1
    assert [(p["epoch"], p["iteration"]) for p in _probes(save_dir)] == [(1, 3), (1, 3)]


def test_a_crash_on_one_rank_ends_the_run_non_zero_with_its_traceback(tmp_path):
    config = _write_config(
        tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), fault_crash_rank=1, fault_crash_at=2
    )
    done = _cli("train", f"--config={config}", "--override=nproc_per_node=2", *GLOO)
    assert done.returncode != 0
    assert "injected crash on rank 1 at iteration 2" in done.stdout + done.stderr
    assert "Traceback" in done.stderr
    # Its peer, which would wait for it in the next collective, is killed once torch has named
    # the rank that failed (not sent a SIGTERM, then killed 30 s later).
    assert re.search(r"so its peers are stopped: process \d+ killed", done.stderr), done.stderr


def test_a_rank_dying_in_teardown_after_the_run_finished_is_a_success(tmp_path):
    save_dir = tmp_path / "run"
    config = _write_config(
        tmp_path / "cfg.py", save_dir=str(save_dir), max_epochs=1, fault_abort_at_exit_rank=1
    )
    done = _cli("train", f"--config={config}", "--override=nproc_per_node=2", *GLOO)
    assert "TRAINING COMPLETE after " in _ok(done)
    assert "rank 1 ended with SIGABRT in torch's process-group teardown" in done.stderr
    assert len(_probes(save_dir)) == 2


def test_a_rank_dying_before_every_rank_finished_still_fails_the_run(tmp_path):
    config = _write_config(
        tmp_path / "cfg.py",
        save_dir=str(tmp_path / "run"),
        max_epochs=1,
        fault_crash_rank=1,
        fault_crash_at=2,
        fault_abort_at_exit_rank=0,
    )
    done = _cli("train", f"--config={config}", "--override=nproc_per_node=2", *GLOO)
    assert done.returncode != 0
    assert "injected crash on rank 1 at iteration 2" in done.stdout + done.stderr


def test_launch_many_reports_the_failed_config(tmp_path):
    good = _write_config(tmp_path / "good.py", save_dir=str(tmp_path / "good"), max_epochs=1)
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from gatle_ignite import base_config\n\n\ndef get_config():\n    return base_config()\n"
    )
    done = _cli("train", f"--config={good},{bad}")
    assert done.returncode == 1, done.stdout
    assert done.stdout.count("Launching: ") == 2
    assert "[good] TRAINING COMPLETE after " in done.stdout
    assert "[bad] " in done.stdout and "config error:" in done.stdout
    assert done.stdout.rstrip().endswith("Failed configs: bad")


def test_torchrun_is_joined_and_matches_the_self_spawned_run(tmp_path):
    fields = {"max_epochs": 2, "train_ds_params": {"n": 64, "bs": 16, "shuffle": True}}
    spawned_dir, torchrun_dir = tmp_path / "spawned", tmp_path / "torchrun"
    spawned = _write_config(tmp_path / "spawned.py", save_dir=str(spawned_dir), **fields)
    joined = _write_config(tmp_path / "joined.py", save_dir=str(torchrun_dir), **fields)
    _ok(_cli("train", f"--config={spawned}", "--override=nproc_per_node=2", *GLOO))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        "-m",
        "gatle_ignite",
        "train",
        f"--config={joined}",
        *GLOO,
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=_clean_env()
    )
    out = _ok(done)
    assert out.count("MODEL: ") == 1 and out.count("TRAINING COMPLETE after ") == 1
    assert sorted(p["env_rank"] for p in _probes(torchrun_dir)) == ["0", "1"]
    assert [p["world_size"] for p in _probes(torchrun_dir)] == [2, 2]
    a = torch.load(spawned_dir / "final_weights.pt", weights_only=True)
    b = torch.load(torchrun_dir / "final_weights.pt", weights_only=True)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def _srun_job_step(config, stderr=subprocess.STDOUT):
    """Start the 2 tasks of a SLURM job step on this machine, as srun would."""
    job_id = str(random.randint(10000, 99999))
    ranks = []
    for rank in (0, 1):
        env = _clean_env(
            SLURM_JOB_ID=job_id,
            SLURM_STEP_ID="0",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS="2",
            SLURM_JOB_NODELIST="localhost",
            SLURM_JOB_NUM_NODES="1",
            PYTHONUNBUFFERED="1",
        )
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}", *GLOO],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        )
    return ranks


def test_an_srun_job_step_is_joined(tmp_path):
    save_dir = tmp_path / "run"
    config = _write_config(tmp_path / "cfg.py", save_dir=str(save_dir), max_epochs=1)
    ranks = _srun_job_step(config)
    outputs = [proc.communicate(timeout=HANG_S)[0] for proc in ranks]
    assert [proc.returncode for proc in ranks] == [0, 0], outputs
    assert [p["world_size"] for p in _probes(save_dir)] == [2, 2]
    assert "MODEL: " in outputs[0] and "MODEL: " not in outputs[1]


def test_spawning_inside_a_slurm_allocation_works(tmp_path):
    """Under sbatch without srun, SLURM_JOB_ID is set but this process spawns its own ranks."""
    save_dir = tmp_path / "run"
    config = _write_config(tmp_path / "cfg.py", save_dir=str(save_dir), max_epochs=1)
    env = _clean_env(SLURM_JOB_ID="4242", SLURM_NTASKS="1", SLURM_PROCID="0")
    _ok(_cli("train", f"--config={config}", "--override=nproc_per_node=2", *GLOO, env=env))
    assert [p["world_size"] for p in _probes(save_dir)] == [2, 2]


def test_run_task_returns_the_task_on_every_rank(tmp_path):
    config = _write_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), max_epochs=1)
    done = subprocess.run(
        [sys.executable, "-m", "tests.toy.run_task_on_ranks", config, str(free_port())]
        + ["auto_model_params.sync_bn=False"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=_clean_env(),
    )
    out = _ok(done)
    for rank in (0, 1):
        # The DDP wrapper is gone: it held the process group past ignite's teardown.
        assert f"rank {rank} got Trainer with a Model model after 4 iterations" in out


# Long enough that no live rank makes its peer wait that long, even on a loaded machine (a slow
# start before the first collective): only the stall does.
STALL = {"max_epochs": 2, "dist_timeout": 60, "fault_stall_rank": 1, "fault_stall_at": 3}
# Far beyond dist_timeout and the teardown after it, yet under torch's default collective timeout
# (30 minutes), which a run whose dist_timeout was not applied would wait out.
STALL_ENDS_S = 25 * 60
STALLED = "injected stall on rank 1 at iteration 3"


def _read_until(stream, text):
    lines = []
    for line in stream:
        lines.append(line)
        if text in line:
            return
    raise AssertionError(f"no {text!r} before the end:\n" + "".join(lines[-30:]))


def test_a_stalled_rank_ends_the_spawned_run_by_its_dist_timeout(tmp_path):
    """Ended by dist_timeout (within STALL_ENDS_S of the stall, not torch's default 30 minutes);
    no tighter bound on the time, which a loaded machine stretches."""
    config = _write_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **STALL)
    process = subprocess.Popen(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"]
        + ["--override=nproc_per_node=2", *GLOO],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_env(PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )
    _read_until(process.stdout, STALLED)
    _out, err = process.communicate(timeout=STALL_ENDS_S)
    assert process.returncode == 69, (process.returncode, err[-3000:])
    assert err.count("distributed timeout: rank 0 waited more than dist_timeout=60 s") == 1
    assert "Traceback" not in err
    assert no_process_left(process.pid)


def test_a_stalled_rank_in_a_joined_world_times_its_peer_out(tmp_path):
    config = _write_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **STALL)
    waiting, stalling = _srun_job_step(config, stderr=subprocess.PIPE)
    try:
        _read_until(stalling.stdout, STALLED)
        _out, err = waiting.communicate(timeout=STALL_ENDS_S)
    finally:
        stalling.kill()
        stalling.communicate()
    assert waiting.returncode == 69, (waiting.returncode, err[-3000:])
    assert err.count("distributed timeout: rank 0 waited more than dist_timeout=60 s") == 1


def test_a_batchnorm_model_trains_on_two_cpu_processes_with_the_default_sync_bn(tmp_path):
    save_dir = tmp_path / "run"
    config = _write_config(
        tmp_path / "cfg.py",
        save_dir=str(save_dir),
        max_epochs=1,
        model_params={"batchnorm": True},
    )
    done = _cli("train", f"--config={config}", "--override=nproc_per_node=2")
    out = _ok(done)
    assert "SyncBatchNorm layers only work" not in done.stderr
    assert out.count("sync_bn: the gloo backend cannot synchronise BatchNorm") == 1
    assert "TRAINING COMPLETE after " in out
    weights = torch.load(save_dir / "final_weights.pt", weights_only=True)
    assert "norm.running_mean" in weights
