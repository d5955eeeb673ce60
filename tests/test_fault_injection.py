"""Fault injection: real training processes killed (SIGKILL) or preempted (SIGTERM), resumed.

Each interrupted run is resumed and must end on weights bit-identical to the uninterrupted run:
with shuffling, dropout, a random augmentation in two DataLoader workers, and a schedule.
"""

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from gatle_ignite.trainer.preemption import EXIT_INTERRUPTED, EXIT_PREEMPTED
from tests.conftest import HANG_S, ROOT, free_port, no_process_left

pytestmark = pytest.mark.slow

GLOO = ["--override=dist_backend='gloo'", "--override=auto_model_params.sync_bn=False"]
FIELDS = {
    "main_runner": "tests.toy.dist_trainer",
    "max_epochs": 3,
    "save_every_iters": 1,
    "model_params": {"dropout": 0.3},
    "train_ds_name": "tests.toy.data_aug",
    "train_ds_params": {"n": 64, "bs": 16, "shuffle": True, "num_workers": 2},
    "lr_scheduler": "gatle_ignite.schedulers.warmup_cosine",
}


def _config(tmp_path, name, **fields):
    path = tmp_path / f"{name}.py"
    fields = {**FIELDS, "save_dir": str(tmp_path / name), **fields}
    path.write_text(
        "from tests.toy.config import toy_config\n\n\n"
        f"def get_config():\n    return toy_config(**{fields!r})\n"
    )
    return path


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


GATLE_IGNITE = [sys.executable, "-m", "gatle_ignite"]


def _torchrun():
    """torchrun starting 2 workers of the CLI, on a port of its own."""
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    return [*run, f"--master_port={free_port()}", "-m", "gatle_ignite"]


def _train(config, *args, launcher=GATLE_IGNITE):
    done = subprocess.run(
        [*launcher, "train", f"--config={config}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=_env(),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _start(config, *args, launcher=GATLE_IGNITE):
    return subprocess.Popen(
        [*launcher, "train", f"--config={config}", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        start_new_session=True,
    )


def _after_lines(process, text, count=1):
    """Read the child's output until it has printed ``text`` ``count`` times (ranks' lines can
    share one)."""
    seen, lines = 0, []
    for line in process.stdout:
        lines.append(line)
        seen += line.count(text)
        if seen >= count:
            return lines
    raise AssertionError("the run ended first:\n" + "".join(lines[-30:]))


def _after_progress_lines(process, count):
    """Read the child's output until it has printed ``count`` TRAIN progress lines."""
    return _after_lines(process, " TRAIN epoch ", count)


def _kill_group(process, signum):
    os.killpg(process.pid, signum)


def _gated(tmp_path, at: int) -> dict:
    """Fields that hold every rank in iteration ``at`` until ``_signal_at_the_gate`` opens it."""
    return {"fault_gate_at": at, "fault_gate": str(tmp_path / "gate")}


def _signal_at_the_gate(process, tmp_path, send, ranks=1) -> None:
    """Once every rank waits at the gate, ``send`` the signal, then open the gate: the signal
    lands mid-run however loaded the machine, not after the run has ended."""
    _after_lines(process, "waiting at the gate", count=ranks)
    send()
    (tmp_path / "gate").touch()


def _weights(save_dir):
    return torch.load(save_dir / "final_weights.pt", weights_only=True)


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    _train(_config(tmp, "one"))
    two = _config(tmp, "two", train_ds_params={**FIELDS["train_ds_params"], "num_workers": 0})
    _train(two, "--override=nproc_per_node=2", *GLOO)
    workers = _config(tmp, "workers")
    _train(workers, "--override=nproc_per_node=2", *GLOO)
    return {
        "one": _weights(tmp / "one"),
        "two": _weights(tmp / "two"),
        "two_with_workers": _weights(tmp / "workers"),
    }


def test_sigkill_at_random_iterations_then_resume_is_bit_identical(tmp_path, reference):
    config = _config(tmp_path, "run")
    rng = random.Random()
    for _attempt in range(2):
        process = _start(config, "--override=resume=True")
        _after_progress_lines(process, rng.randint(1, 5))
        _kill_group(process, signal.SIGKILL)
        process.wait(timeout=HANG_S)
    _train(config, "--override=resume=True")
    _assert_identical(reference["one"], _weights(tmp_path / "run"))


def test_sigkill_during_a_checkpoint_write_leaves_every_checkpoint_loadable(tmp_path, reference):
    config = _config(tmp_path, "run", ballast_mb=64, n_saved=1)
    save_dir = tmp_path / "run"
    process = _start(config)
    _after_progress_lines(process, random.randint(1, 4))
    # A checkpoint is written to a staging name in save_dir, then renamed into place.
    while not [p for p in save_dir.iterdir() if ".partial-" in p.name]:
        assert process.poll() is None, "the run ended before a checkpoint write was seen"
        time.sleep(0.001)
    _kill_group(process, signal.SIGKILL)
    process.wait(timeout=HANG_S)
    finished = sorted(save_dir.glob("latest_*.pt"))
    assert finished, "the kill left no resumable checkpoint"
    for path in finished:
        torch.load(path, weights_only=True)
    _train(config, "--override=resume=True")
    _assert_identical(reference["one"], _weights(save_dir))


def test_sigterm_saves_exits_75_and_the_resumed_run_is_bit_identical(tmp_path, reference):
    config = _config(tmp_path, "run", save_every_iters=0, **_gated(tmp_path, 6))
    process = _start(config)
    _signal_at_the_gate(process, tmp_path, lambda: _kill_group(process, signal.SIGTERM))
    rest = process.communicate(timeout=HANG_S)[0]
    assert process.returncode == EXIT_PREEMPTED, rest
    assert "PREEMPTED by SIGTERM after iteration" in rest
    assert list((tmp_path / "run").glob("latest_iter_checkpoint_*.pt"))
    _train(config, "--override=resume=True")
    _assert_identical(reference["one"], _weights(tmp_path / "run"))


def test_two_ranks_preempted_by_sigusr1_resume_exactly(tmp_path, reference):
    config = _config(
        tmp_path,
        "run",
        save_every_iters=0,
        train_ds_params={**FIELDS["train_ds_params"], "num_workers": 0},
        **_gated(tmp_path, 4),
    )
    args = ["--override=nproc_per_node=2", *GLOO]
    process = _start(config, *args)
    # To the launcher only: it forwards to its ranks.
    _signal_at_the_gate(process, tmp_path, lambda: process.send_signal(signal.SIGUSR1), ranks=2)
    rest = process.communicate(timeout=HANG_S)[0]
    assert process.returncode == EXIT_PREEMPTED, rest
    # The preemption message says how the ranks ended; torch's stopping of a peer is not news.
    assert "Terminating process" not in rest
    _train(config, "--override=resume=True", *args)
    _assert_identical(reference["two"], _weights(tmp_path / "run"))


def test_two_ranks_killed_then_resumed_are_bit_identical(tmp_path, reference):
    config = _config(
        tmp_path, "run", train_ds_params={**FIELDS["train_ds_params"], "num_workers": 0}
    )
    args = ["--override=nproc_per_node=2", *GLOO]
    process = _start(config, *args)
    _after_progress_lines(process, random.randint(2, 6))
    _kill_group(process, signal.SIGKILL)
    process.wait(timeout=HANG_S)
    _train(config, "--override=resume=True", *args)
    _assert_identical(reference["two"], _weights(tmp_path / "run"))


def test_a_second_sigterm_kills_a_stalled_rank_and_says_so(tmp_path):
    # No dist_timeout: rank 0 waits for the stalled rank 1 for torch's default 30 minutes.
    config = _config(
        tmp_path,
        "run",
        fault_stall_rank=1,
        fault_stall_at=3,
        train_ds_params={**FIELDS["train_ds_params"], "num_workers": 0},
    )
    process = _start(config, "--override=nproc_per_node=2", *GLOO)
    _after_lines(process, "injected stall on rank 1 at iteration 3")
    process.send_signal(signal.SIGTERM)
    time.sleep(3)
    assert process.poll() is None, "the first signal cannot stop a stalled rank"
    process.send_signal(signal.SIGTERM)
    # Ended by the second signal (exit 1): else torch's default timeout, 30 minutes on (exit 69).
    rest = process.communicate(timeout=HANG_S)[0]
    assert process.returncode == 1, rest
    assert "stopped by a second SIGTERM: the ranks had not stopped after the first" in rest
    assert no_process_left(process.pid)


def test_sigterm_to_torchrun_lets_the_workers_save_and_a_torchrun_resume_finishes(tmp_path):
    config = _config(
        tmp_path,
        "run",
        max_epochs=1,
        save_every_iters=1000,
        iter_sleep_s=0.05,
        train_ds_params={**FIELDS["train_ds_params"], "n": 2048, "num_workers": 0},
    )
    process = _start(config, *GLOO, launcher=_torchrun())
    _after_progress_lines(process, 2)
    process.send_signal(signal.SIGTERM)  # to torchrun only: its agent passes it to the workers
    rest = process.communicate(timeout=HANG_S)[0]
    # torchrun reports a signal to itself as its own failure: exit 1, never 75.
    assert process.returncode == 1, rest
    assert "PREEMPTED by SIGTERM after iteration" in rest
    assert list((tmp_path / "run").glob("latest_iter_checkpoint_*.pt"))
    resumed = _train(config, "--override=resume=True", *GLOO, launcher=_torchrun())
    assert "TRAINING COMPLETE after " in resumed


def _status(save_dir):
    done = subprocess.run(
        [*GATLE_IGNITE, "status", str(save_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=_env(),
    )
    return done.returncode, done.stdout


def _ctrl_c(process):
    """What a terminal does on Ctrl-C: SIGINT to every process of the foreground group, the
    launcher, its ranks and their DataLoader workers alike."""
    _kill_group(process, signal.SIGINT)


@pytest.mark.parametrize("nproc", [1, 2])
def test_ctrl_c_saves_exits_130_without_a_traceback_and_resumes_exactly(tmp_path, reference, nproc):
    config = _config(tmp_path, "run", save_every_iters=0, **_gated(tmp_path, 6))
    args = ["--override=nproc_per_node=2", *GLOO] if nproc == 2 else []
    process = _start(config, *args)
    _signal_at_the_gate(process, tmp_path, lambda: _ctrl_c(process), ranks=nproc)
    rest = process.communicate(timeout=HANG_S)[0]
    assert process.returncode == EXIT_INTERRUPTED, rest
    assert rest.count("INTERRUPTED by SIGINT after iteration") == 1, rest
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    if nproc == 1:
        # Two ranks agree at their next check point, here the epoch's end and its checkpoint.
        assert list((tmp_path / "run").glob("latest_iter_checkpoint_*.pt"))
    code, status = _status(tmp_path / "run")
    assert code == EXIT_PREEMPTED and "state:    preempted" in status, status
    _train(config, "--override=resume=True", *args)
    expected = reference["one" if nproc == 1 else "two_with_workers"]
    _assert_identical(expected, _weights(tmp_path / "run"))


def test_a_second_ctrl_c_after_the_ranks_saved_says_so_and_the_resume_starts_there(tmp_path):
    # Rank 0's logging backend takes long to finish, so the second Ctrl-C lands after the ranks
    # have written their preemption checkpoint, while rank 0 closes down.
    marker = tmp_path / "finishing"
    config = _config(
        tmp_path,
        "run",
        save_every_iters=0,
        train_ds_params={**FIELDS["train_ds_params"], "num_workers": 0},
        logger_name=["tests.toy.slow_finish_backend"],
        slow_finish_marker=str(marker),
        **_gated(tmp_path, 3),
    )
    args = ["--override=nproc_per_node=2", *GLOO]
    process = _start(config, *args)
    _signal_at_the_gate(process, tmp_path, lambda: _ctrl_c(process), ranks=2)
    said = _after_lines(process, "INTERRUPTED by SIGINT after iteration")[-1]
    saved = re.search(r"saved (\S+\.pt);", said).group(1)
    while not marker.exists():
        assert process.poll() is None, "rank 0 never reached its teardown"
        time.sleep(0.05)
    _ctrl_c(process)
    rest = process.communicate(timeout=HANG_S)[0]
    assert process.returncode == EXIT_INTERRUPTED, rest
    assert "after they had saved the preemption checkpoint named above" in rest, rest
    assert "without a preemption checkpoint" not in rest
    assert no_process_left(process.pid)
    resumed = _train(config, "--override=resume=True", "--override=logger_name=[]", *args)
    assert f"RESUMING FROM: {saved}" in resumed


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_second_ctrl_c_stops_at_once_and_the_run_stays_resumable(tmp_path, nproc):
    # The gate never opens: both Ctrl-Cs land in iteration 2 however loaded the machine, and the
    # run ends only if the second stops it at once, not at the iteration's end.
    config = _config(tmp_path, "run", save_every_iters=0, **_gated(tmp_path, 2))
    args = ["--override=nproc_per_node=2", *GLOO] if nproc == 2 else []
    process = _start(config, *args)
    _after_lines(process, "waiting at the gate", count=nproc)
    _ctrl_c(process)
    # Two signals sent at once arrive as one: the second counts once the first is taken.
    _after_lines(process, "Ctrl-C again stops")
    _ctrl_c(process)
    rest = process.communicate(timeout=HANG_S)[0]
    assert process.returncode == EXIT_INTERRUPTED, rest
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    assert "INTERRUPTED by SIGINT after iteration" not in rest
    assert "second SIGINT" in rest, rest
    assert no_process_left(process.pid)
    code, status = _status(tmp_path / "run")
    assert code == EXIT_PREEMPTED and "state:    interrupted" in status, status
