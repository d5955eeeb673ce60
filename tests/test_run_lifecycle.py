"""Random lives of one save_dir: train, resume, kill, damage the newest file, evaluate.

Whatever happens in between, the manifest indexes exactly the checkpoint files on disk once a
process has finished with the directory (after a kill: at least every indexed file exists), and
the run, resumed until it completes, ends on the weights of a run that was never interrupted.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gatle_ignite.cli.main import main
from gatle_ignite.run.layout import MANIFEST_FILE, checkpoint_files
from tests.conftest import HANG_S, ROOT, child_env
from tests.toy.config_file import write_toy_config

pytestmark = pytest.mark.slow

FIELDS = {
    "max_epochs": 3,
    "n_saved": 2,
    "save_every_iters": 1,
    "model_params": {"dropout": 0.3},
    "train_ds_params": {"n": 64, "bs": 16, "shuffle": True, "seed": 0},
}
STEPS = ("train", "kill", "damage", "eval")


def _config(directory: Path) -> str:
    return write_toy_config(directory / "life.py", **FIELDS, save_dir=str(directory / "run"))


def _cli(*args) -> int:
    return main([*args[:1], f"--config={args[1]}", *args[2:]])


def _final_weights(save_dir: Path) -> dict:
    state = torch.load(save_dir / "latest_epoch_checkpoint_3.pt", weights_only=True)
    return state["model"]


@pytest.fixture(scope="module")
def uninterrupted():
    directory = Path(tempfile.mkdtemp())
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert _cli("train", _config(directory)) == 0
        return _final_weights(directory / "run")
    finally:
        os.chdir(cwd)
        shutil.rmtree(directory, ignore_errors=True)


def _indexed(save_dir: Path) -> set:
    manifest = json.loads((save_dir / MANIFEST_FILE).read_text())
    return {entry["file"] for entry in manifest["checkpoints"]}


def _on_disk(save_dir: Path) -> set:
    return {p.name for p in checkpoint_files(save_dir)}


def _train(config: Path) -> int:
    code = _cli("train", config, "--override=resume=True")
    if code == 2:
        # Every checkpoint damaged: the only way on is to replace the run.
        code = _cli("train", config, "--override=replace_run=True")
    return code


def _kill(config: Path, after_lines: int) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"]
        + ["--override=resume=True"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen, deadline = 0, time.monotonic() + HANG_S
    while seen < after_lines and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen += "TRAIN epoch" in line
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=HANG_S)


def _damage_newest(save_dir: Path, rng: random.Random) -> None:
    files = [p for p in checkpoint_files(save_dir) if not p.name.startswith("valid_")]
    if files:
        newest = max(files, key=lambda p: p.stat().st_mtime_ns)
        newest.write_bytes(rng.randbytes(rng.choice([0, 100, 5000])))


# Derandomized, so that CI explores the same lives every time; raise max_examples (or run with
# --hypothesis-seed) to explore more of them locally.
@settings(
    max_examples=15,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(st.sampled_from(STEPS), min_size=1, max_size=8), seed=st.integers(0, 99))
def test_any_life_of_a_run_directory_keeps_its_index_and_ends_on_the_same_weights(
    uninterrupted, monkeypatch, steps, seed
):
    monkeypatch.chdir(ROOT)
    rng = random.Random(seed)
    directory = Path(tempfile.mkdtemp())
    config, save_dir = _config(directory), directory / "run"
    try:
        for step in steps:
            if step == "train":
                assert _train(config) == 0
            elif step == "kill":
                _kill(config, after_lines=rng.randint(1, 10))
            elif step == "damage":
                _damage_newest(save_dir, rng)
            elif step == "eval" and save_dir.exists():
                assert _cli("eval", config, "--ckpt=latest") in (0, 2)
            if (save_dir / MANIFEST_FILE).exists():
                # A kill can leave a file written but not yet indexed; the next start adopts it.
                assert _indexed(save_dir) <= _on_disk(save_dir), steps
                if step == "train":
                    assert _indexed(save_dir) == _on_disk(save_dir), steps
        assert _train(config) == 0
        assert _indexed(save_dir) == _on_disk(save_dir)
        final = _final_weights(save_dir)
        assert final.keys() == uninterrupted.keys()
        assert all(torch.equal(final[k], uninterrupted[k]) for k in final), steps
    finally:
        shutil.rmtree(directory, ignore_errors=True)
