"""The machine's budget for processes run at once: each its share of the cores and GPUs.

Without it every process uses every core (train --config=a,b,c took 165 s per child instead of
8 s on 2 cores); a value the user set for OMP_NUM_THREADS always stands.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_fixtures.configs import make_config

from gatle_ignite.cli import launch
from gatle_ignite.launch import budget
from gatle_ignite.launch.budget import CPUS_VAR, Share, shares
from tests.conftest import HANG_S

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def machine(monkeypatch):
    """Eight cores, no GPU and no thread setting of the user's, unless a test says otherwise."""
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    real = budget.available_cpus

    def eight_cores(env=None):
        env = os.environ if env is None else env
        return real(env) if env.get(CPUS_VAR) else 8

    monkeypatch.setattr(budget, "available_cpus", eight_cores)
    for name in ("OMP_NUM_THREADS", CPUS_VAR, "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def test_each_of_several_processes_gets_its_share_of_the_cores():
    assert [s.threads for s in shares(3)] == [2, 2, 2]
    assert [s.threads for s in shares(16)] == [1] * 16
    assert shares(1)[0].apply({}) == {"OMP_NUM_THREADS": "8", CPUS_VAR: "8"}


def test_a_thread_count_the_user_set_stands(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert shares(2) == [Share(None), Share(None)]
    assert Share(None).apply({"OMP_NUM_THREADS": "3"}) == {"OMP_NUM_THREADS": "3"}


def test_a_share_handed_down_is_divided_again(monkeypatch):
    # A sweep worker's trial got 4 of the 8 cores; its 2 ranks get 2 each, not 4 of the 8.
    shares(2)[0].apply(os.environ)
    assert os.environ["OMP_NUM_THREADS"] == "4"
    assert [s.threads for s in shares(2)] == [2, 2]


@pytest.mark.parametrize(
    "visible, count, expected",
    [
        ("0,1,2,3", 2, ["0,1", "2,3"]),
        ("0,1,2,3,4,5,6,7", 3, ["0,1", "2,3", "4,5"]),
        ("4,5", 4, ["4", "5", "4", "5"]),
        ("0", 2, [None, None]),
    ],
)
def test_gpus_are_split_into_equal_groups(monkeypatch, visible, count, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [s.devices for s in shares(count)] == expected


def test_without_cuda_visible_devices_the_gpus_torch_sees_are_split(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [s.devices for s in shares(2)] == ["0", "1"]
    assert Share(4, "1").apply({})["CUDA_VISIBLE_DEVICES"] == "1"


class FakeChild:
    def __init__(self, command, **kwargs):
        self.kwargs = kwargs
        self.stdout = iter(["done\n"])

    def wait(self):
        return 0


def test_configs_trained_at_once_each_get_their_share(monkeypatch, capsys):
    children = []
    monkeypatch.setattr(
        launch.subprocess,
        "Popen",
        lambda cmd, **kw: children.append(FakeChild(cmd, **kw)) or children[-1],
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert launch.launch_many(["a.py", "b.py"]) == 0
    envs = [child.kwargs["env"] for child in children]
    assert [env["OMP_NUM_THREADS"] for env in envs] == ["4", "4"]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0,1", "2,3"]


def test_the_ranks_the_launcher_spawns_share_the_cores(monkeypatch):
    seen = []

    class Recording:
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            seen.append((os.environ.get("OMP_NUM_THREADS"), os.environ.get(CPUS_VAR)))
            return self

        def __exit__(self, *exc_info):
            return False

        def run(self, fn, *args):
            pass

    monkeypatch.setattr(launch.idist, "Parallel", Recording)
    launch.launch(make_config(nproc_per_node=2))
    assert seen == [("4", "4")]
    # Only while spawning: this process keeps what it had.
    assert "OMP_NUM_THREADS" not in os.environ and CPUS_VAR not in os.environ


def _spawned_threads(tmp_path, budgeted: bool) -> list:
    script = tmp_path / "ranks.py"
    script.write_text(
        "import contextlib, torch, torch.multiprocessing as mp\n"
        "from gatle_ignite.launch.budget import ranks_share\n"
        # One write per rank: unbuffered, print's text and newline are two, which interleave.
        "def rank(i):\n    print(f'{torch.get_num_threads()}\\n', end='', flush=True)\n"
        "if __name__ == '__main__':\n"
        f"    with ranks_share(2) if {budgeted} else contextlib.nullcontext():\n"
        "        mp.spawn(rank, nprocs=2)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=HANG_S
    )
    assert done.returncode == 0, done.stderr
    return [int(n) for n in done.stdout.split()]


@pytest.mark.slow
def test_spawned_ranks_really_run_with_their_share(tmp_path):
    """Two real ranks of torch's spawn: each reads the variable at its torch import."""
    cores = len(os.sched_getaffinity(0))
    assert _spawned_threads(tmp_path, budgeted=True) == [max(1, cores // 2)] * 2
    # Without the budget each rank takes every core (torch's default).
    assert _spawned_threads(tmp_path, budgeted=False) == [cores] * 2
