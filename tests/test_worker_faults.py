"""A run whose DataLoader workers fail, or that is interrupted, ends: non-zero, with its traceback.

The workers ignore preemption signals, so that only the main process decides a preemption; a
worker that ignored the SIGTERM multiprocessing ends it with as the main process exits would
keep a failed run waiting for good. Each run here is a real `gatle-ignite train` process with two
workers per loader; the subprocess timeout is the hang detector.
"""

import os
import signal
import subprocess
import sys

import pytest

from gatle_ignite.trainer.preemption import EXIT_PREEMPTED
from tests.conftest import HANG_S, ROOT, child_env, no_process_left
from tests.toy.config_file import write_toy_config

pytestmark = pytest.mark.slow

GLOO = ["--override=dist_backend='gloo'", "--override=auto_model_params.sync_bn=False"]


def _config(tmp_path, **data) -> str:
    params = {"n": 64, "bs": 16, "shuffle": False, "num_workers": 2, **data}
    return write_toy_config(
        tmp_path / "cfg.py",
        save_dir=str(tmp_path / "run"),
        max_epochs=3,
        train_ds_name="tests.toy.faulty_data",
        train_ds_params=params,
    )


def _start(config, *args):
    return subprocess.Popen(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        start_new_session=True,
    )


def _ended(process, lines=()) -> str:
    """What the process printed once it ended; it must end within HANG_S."""
    try:
        rest = process.communicate(timeout=HANG_S)[0]
    except subprocess.TimeoutExpired:
        no_process_left(process.pid)  # kills what is left
        process.communicate()
        pytest.fail(f"the run did not end within {HANG_S} s:\n" + "".join(lines)[-3000:])
    assert no_process_left(process.pid), "a worker outlived the run"
    return "".join(lines) + rest


def _after_progress_lines(process, count, text=" TRAIN epoch ") -> list:
    """Read the child's output until ``count`` lines hold ``text``."""
    seen, lines = 0, []
    for line in process.stdout:
        lines.append(line)
        seen += text in line
        if seen >= count:
            return lines
    raise AssertionError("the run ended first:\n" + "".join(lines[-30:]))


def test_a_corrupt_sample_read_in_a_worker_ends_the_run_with_its_traceback(tmp_path):
    process = _start(_config(tmp_path, fault_index=21, fault="raise"))
    out = _ended(process)
    assert process.returncode == 1, out[-3000:]
    assert "Traceback" in out and "ValueError: sample 21 is corrupt" in out


def test_a_worker_killed_by_sigsegv_ends_the_run_with_the_main_process_traceback(tmp_path):
    process = _start(_config(tmp_path, fault_index=21, fault="segfault"))
    out = _ended(process)
    assert process.returncode == 1, out[-3000:]
    assert "Traceback" in out and "DataLoader worker" in out


def test_sigint_to_the_main_process_only_saves_and_ends_the_run(tmp_path):
    # Data-bound: the signal lands while the main process waits for a batch.
    process = _start(_config(tmp_path, n=256, item_sleep_s=0.05))
    lines = _after_progress_lines(process, 2)
    process.send_signal(signal.SIGINT)  # the main process only; its workers get nothing
    out = _ended(process, lines)
    assert process.returncode == 130, out[-3000:]
    assert "INTERRUPTED by SIGINT" in out and "Traceback" not in out


def test_a_second_sigint_to_the_main_process_only_stops_it_without_waiting_on_workers(tmp_path):
    # The second one stops at once (KeyboardInterrupt in the main process, mid-batch): the run
    # must still end, not wait forever on workers that ignore the signals.
    process = _start(_config(tmp_path, n=256, item_sleep_s=0.05))
    lines = _after_progress_lines(process, 2)
    process.send_signal(signal.SIGINT)
    # Two signals sent at once arrive as one: the second counts once the first is taken.
    lines += _after_progress_lines(process, 1, text="Ctrl-C again stops")
    process.send_signal(signal.SIGINT)
    out = _ended(process, lines)
    assert process.returncode == 130, out[-3000:]
    assert "stopped at once by a second SIGINT" in out, out[-3000:]


def test_a_corrupt_sample_on_a_spawned_rank_ends_the_node(tmp_path):
    config = _config(tmp_path, fault_index=21, fault="raise")
    process = _start(config, "--override=nproc_per_node=2", *GLOO)
    out = _ended(process)
    assert process.returncode == 1, out[-3000:]
    assert "ValueError: sample 21 is corrupt" in out


def test_sigterm_to_every_process_still_preempts_the_run(tmp_path):
    process = _start(_config(tmp_path, n=256, item_sleep_s=0.005))
    lines = _after_progress_lines(process, 2)
    # As a scheduler does: the workers get it too, ignore it, and keep serving batches.
    os.killpg(process.pid, signal.SIGTERM)
    out = _ended(process, lines)
    assert process.returncode == EXIT_PREEMPTED, out[-3000:]
    assert "PREEMPTED by SIGTERM after iteration" in out
    assert list((tmp_path / "run").glob("latest_iter_checkpoint_*.pt"))
