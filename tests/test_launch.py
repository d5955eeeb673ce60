"""The launcher (CONTRACT 2.6): topology, rendezvous, spawning, and parallel configs."""

import datetime
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_fixtures import trainer as fixture_trainer
from cli_fixtures.configs import make_config, write_config
from ml_collections import config_dict

from gatle_ignite.cli import launch
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.launch.task import peer_timeout_reported
from gatle_ignite.launch.world import existing_world

TESTS_DIR = Path(__file__).resolve().parent
PORTS = range(49152, 65536)
WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    monkeypatch.setattr(fixture_trainer, "CALLS", [])
    # Registered so that whatever launch() exports is undone after each test.
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def _gpus(monkeypatch, count, cuda=None):
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: count)
    available = count > 0 if cuda is None else cuda
    monkeypatch.setattr(launch.torch.cuda, "is_available", lambda: available)


def _cfg(**fields):
    """A valid config whose process count is left to the launcher."""
    return make_config(**{"nproc_per_node": None, **fields})


class FakeParallel:
    """Records how launch() would start ignite's workers, without starting any."""

    instances = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.runs = []
        FakeParallel.instances.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def run(self, fn, *args):
        self.runs.append((fn, args))


@pytest.fixture
def parallel(monkeypatch):
    monkeypatch.setattr(FakeParallel, "instances", [])
    monkeypatch.setattr(launch.idist, "Parallel", FakeParallel)
    return FakeParallel.instances


# ----------------------------------------------------------------------------- run_task


def test_run_task_fits_and_returns_what_fit_returns():
    cfg = _cfg()
    task = launch.run_task(3, cfg)
    assert isinstance(task, fixture_trainer.Trainer) and task.local_rank == 3
    assert [call[0] for call in fixture_trainer.CALLS] == ["fit"]


@pytest.mark.parametrize("run", [True, False, None])
def test_run_task_evaluates_whenever_run_is_present(run):
    cfg = _cfg()
    cfg.run = run
    task = launch.run_task(0, cfg)
    assert isinstance(task, fixture_trainer.Trainer)
    assert [call[0] for call in fixture_trainer.CALLS] == ["evaluate"]


def test_run_task_names_the_main_runner_field():
    with pytest.raises(ConfigError, match="config field 'main_runner'"):
        launch.run_task(0, _cfg(main_runner="cli_fixtures.components"))


GLOO_TIMEOUT = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv"


@pytest.fixture
def exits(monkeypatch):
    """Stand in for os._exit: record the code, and leave the block as SystemExit would."""
    codes = []

    def record(code):
        codes.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(launch.os, "_exit", record)
    return codes


def test_a_collective_timeout_is_one_message_on_stderr_and_exit_69(capsys, exits):
    with pytest.raises(SystemExit), peer_timeout_reported(_cfg(dist_timeout=5)):
        raise RuntimeError(GLOO_TIMEOUT)
    assert exits == [launch.EXIT_PEER_TIMEOUT] == [69]
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and err.startswith("distributed timeout: rank 0 waited more ")
    assert "than dist_timeout=5 s for its peers" in err and "Raise dist_timeout if" in err


def test_without_dist_timeout_the_message_names_torchs_default(capsys, exits):
    with pytest.raises(SystemExit), peer_timeout_reported(_cfg()):
        raise RuntimeError(GLOO_TIMEOUT)
    assert "more than torch's default (dist_timeout unset)" in capsys.readouterr().err


def test_other_errors_pass_through_the_timeout_report(capsys, exits):
    with pytest.raises(RuntimeError, match="DataLoader"), peer_timeout_reported(_cfg()):
        raise RuntimeError("DataLoader timed out after 5 seconds")
    assert capsys.readouterr().err == "" and exits == []


# ----------------------------------------------------------------------------- topology


@pytest.mark.parametrize(
    "gpus, fields, expected",
    [
        (0, {}, (1, 1, 0)),
        (4, {}, (4, 1, 0)),
        (4, {"nproc_per_node": 2}, (2, 1, 0)),
        (0, {"nproc_per_node": 2}, (2, 1, 0)),
        (0, {"nnodes": 3, "node_rank": 2}, (1, 3, 2)),
        (0, {"nnodes": None, "node_rank": None}, (1, 1, 0)),
    ],
)
def test_resolve_topology(monkeypatch, gpus, fields, expected):
    _gpus(monkeypatch, gpus)
    assert launch.resolve_topology(_cfg(**fields)) == expected


def test_resolve_topology_defaults_for_fields_a_config_lacks(monkeypatch):
    _gpus(monkeypatch, 2)
    assert launch.resolve_topology(config_dict.ConfigDict()) == (2, 1, 0)


def test_nnodes_zero_is_refused(monkeypatch):
    _gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match="nnodes must be >= 1, got 0"):
        launch.resolve_topology(_cfg(nnodes=0))


@pytest.mark.parametrize("node_rank", [2, -1])
def test_node_rank_out_of_range_is_refused(monkeypatch, node_rank):
    _gpus(monkeypatch, 0)
    with pytest.raises(
        ConfigError, match=f"node_rank must be in 0..1 for nnodes=2, got {node_rank}"
    ):
        launch.resolve_topology(_cfg(nnodes=2, node_rank=node_rank))


@pytest.mark.parametrize("nproc", [0, -2])
def test_nproc_per_node_below_one_is_refused(monkeypatch, nproc):
    _gpus(monkeypatch, 4)
    with pytest.raises(ConfigError, match=f"nproc_per_node must be >= 1, got {nproc}"):
        launch.resolve_topology(_cfg(nproc_per_node=nproc))


# ----------------------------------------------------------------------------- rendezvous


def test_config_beats_environment(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.9")
    monkeypatch.setenv("MASTER_PORT", "1234")
    cfg = _cfg(master_addr="10.0.0.1", master_port=29500)
    assert launch.resolve_rendezvous(cfg, 1) == ("10.0.0.1", 29500)
    assert launch.resolve_rendezvous(cfg, 2) == ("10.0.0.1", 29500)


def test_environment_is_used_when_config_is_silent(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.9")
    monkeypatch.setenv("MASTER_PORT", "1234")
    assert launch.resolve_rendezvous(_cfg(), 1) == ("10.0.0.9", 1234)


def test_defaults_are_localhost_and_a_random_high_port():
    addr, port = launch.resolve_rendezvous(_cfg(), 1)
    assert addr == "127.0.0.1"
    assert isinstance(port, int) and port in PORTS


@pytest.mark.parametrize("addr", [None, "127.0.0.1", "localhost"])
def test_multi_node_refuses_a_local_address(addr):
    with pytest.raises(ConfigError, match="unrelated models") as info:
        launch.resolve_rendezvous(_cfg(master_addr=addr, master_port=29500), 2)
    assert "MASTER_ADDR" in str(info.value)


def test_multi_node_refuses_a_missing_port():
    with pytest.raises(ConfigError, match="master_port"):
        launch.resolve_rendezvous(_cfg(master_addr="10.0.0.1"), 3)


# ----------------------------------------------------------------------------- backend / kwargs


@pytest.mark.parametrize(
    "backend, cuda, expected",
    [("nccl", False, "gloo"), ("nccl", True, "nccl"), ("gloo", True, "gloo")],
)
def test_resolve_backend(monkeypatch, backend, cuda, expected):
    _gpus(monkeypatch, 0, cuda=cuda)
    assert launch._resolve_backend(_cfg(dist_backend=backend)) == expected


def test_parallel_kwargs():
    assert launch._parallel_kwargs(1, 0, "127.0.0.1", 50000) == {
        "master_addr": "127.0.0.1",
        "master_port": 50000,
    }
    assert launch._parallel_kwargs(3, 1, "10.0.0.1", 29500) == {
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "nnodes": 3,
        "node_rank": 1,
    }


# ----------------------------------------------------------------------------- launch


def test_multi_node_launch_worked_example(monkeypatch, parallel):
    _gpus(monkeypatch, 0)
    monkeypatch.setattr(launch, "run_task", lambda local_rank, cfg: pytest.fail("not here"))
    cfg = _cfg(nproc_per_node=2, nnodes=3, node_rank=1, master_addr="10.0.0.1", master_port=29500)
    assert launch.launch(cfg) is None
    [instance] = parallel
    assert instance.kwargs == {
        "backend": "gloo",
        "nproc_per_node": 2,
        "nnodes": 3,
        "node_rank": 1,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
    }
    # The patched run_task is the one handed to the workers.
    assert instance.runs == [(launch.run_task, (cfg,))]
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.0.0.1", "29500")


def test_single_node_multi_process_launch(monkeypatch, parallel):
    _gpus(monkeypatch, 0)
    cfg = _cfg(nproc_per_node=2)
    launch.launch(cfg)
    [instance] = parallel
    assert instance.kwargs == {
        "backend": "gloo",
        "nproc_per_node": 2,
        "master_addr": "127.0.0.1",
        "master_port": int(os.environ["MASTER_PORT"]),
    }
    assert int(os.environ["MASTER_PORT"]) in PORTS
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
    assert instance.runs == [(launch.run_task, (cfg,))]


def test_dist_timeout_reaches_every_spawned_rank(monkeypatch, parallel):
    _gpus(monkeypatch, 0)
    cfg = _cfg(nproc_per_node=2, dist_timeout=5)
    launch.launch(cfg)
    [instance] = parallel
    assert instance.kwargs["timeout"] == datetime.timedelta(seconds=5)
    assert instance.runs == [(launch.run_task, (cfg,))]


def test_gpus_decide_the_process_count(monkeypatch, parallel):
    _gpus(monkeypatch, 4)
    launch.launch(_cfg())
    assert parallel[0].kwargs["nproc_per_node"] == 4
    assert parallel[0].kwargs["backend"] == "nccl"


def test_single_process_runs_in_place(monkeypatch, parallel):
    _gpus(monkeypatch, 0)
    monkeypatch.setenv("MASTER_PORT", "4321")
    seen = []

    def run_task(local_rank, cfg):
        seen.append(local_rank)
        return cfg

    monkeypatch.setattr(launch, "run_task", run_task)
    cfg = _cfg()
    assert launch.launch(cfg) is cfg
    assert seen == [0] and parallel == []
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("127.0.0.1", "4321")


def test_launch_refuses_a_bad_topology_before_starting(monkeypatch, parallel):
    _gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match="unrelated models"):
        launch.launch(_cfg(nnodes=2, master_port=29500))
    assert parallel == []


def test_an_explicit_sync_bn_where_it_cannot_work_is_refused_before_any_rank_starts(
    monkeypatch, parallel
):
    _gpus(monkeypatch, 0)
    cfg = _cfg(nproc_per_node=2)
    cfg.auto_model_params.sync_bn = True
    with pytest.raises(ConfigError, match=r"auto_model_params\.sync_bn=True.* is gloo on CPU"):
        launch.launch(cfg)
    assert parallel == []


@pytest.mark.parametrize("sync_bn", [None, False])
def test_sync_bn_left_unset_or_false_starts_the_ranks_on_cpu(monkeypatch, parallel, sync_bn):
    _gpus(monkeypatch, 0)
    cfg = _cfg(nproc_per_node=2)
    cfg.auto_model_params.sync_bn = sync_bn
    launch.launch(cfg)
    assert len(parallel) == 1


def test_an_explicit_sync_bn_with_gpus_and_nccl_is_accepted(monkeypatch, parallel):
    _gpus(monkeypatch, 2)
    cfg = _cfg()
    cfg.auto_model_params.sync_bn = True
    launch.launch(cfg)
    assert parallel[0].kwargs["backend"] == "nccl"


# ----------------------------------------------------------------------------- launch_many


def _config_stem(command):
    return Path(command[4].split("=", 1)[1]).stem


class FakeChild:
    """What launch_many uses of a Popen: an iterable ``stdout`` and ``wait()``."""

    def __init__(self, command, returncode, **kwargs):
        self.command = command
        self.kwargs = kwargs
        self.returncode = returncode
        lines = getattr(self, "lines", None) or [f"hello from {_config_stem(command)}\n", "done"]
        self.stdout = iter(lines)

    def wait(self):
        return self.returncode


@pytest.fixture
def fake_popen(monkeypatch):
    """Patch subprocess.Popen; children whose config stem starts with ``bad`` exit 1."""
    children = []

    def popen(command, **kwargs):
        child = FakeChild(command, 1 if _config_stem(command).startswith("bad") else 0, **kwargs)
        children.append(child)
        return child

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    return children


def _launched_ports(out):
    return [int(port) for port in re.findall(r"^Launching: .* \(MASTER_PORT=(\d+)\)$", out, re.M)]


def test_forty_configs_get_forty_distinct_ports(fake_popen, capsys, monkeypatch):
    for name in WORLD_VARS:
        monkeypatch.setenv(name, "3")
    monkeypatch.setenv("KEEP_ME", "yes")
    paths = [f"configs/cfg_{i:02d}.py" for i in range(40)]
    assert launch.launch_many(paths, ["--override=max_epochs=1"]) == 0
    out = capsys.readouterr().out
    ports = _launched_ports(out)
    assert len(ports) == 40 and len(set(ports)) == 40
    assert all(port in PORTS for port in ports)
    for path, port, child in zip(paths, ports, fake_popen):
        assert f"Launching: {path} (MASTER_PORT={port})" in out
        assert child.command == [
            sys.executable,
            "-m",
            "gatle_ignite",
            "train",
            f"--config={path}",
            "--override=max_epochs=1",
        ]
        env = child.kwargs.pop("env")
        assert child.kwargs == {
            "stdout": subprocess.PIPE,
            "stderr": subprocess.STDOUT,
            "text": True,
            "bufsize": 1,
        }
        assert env["MASTER_PORT"] == str(port) and env["MASTER_ADDR"] == "127.0.0.1"
        assert env["KEEP_ME"] == "yes"
        assert not set(WORLD_VARS) & set(env)
    assert "[cfg_07] hello from cfg_07\n" in out and "[cfg_39] done\n" in out
    assert out.endswith("\n\nAll configs completed successfully.\n")


def test_failed_children_are_named(fake_popen, capsys):
    assert launch.launch_many(["ok_1.py", "bad_a.py", "x/ok_2.py", "y/bad_b.py"]) == 1
    out = capsys.readouterr().out
    assert out.endswith("\n\nFailed configs: bad_a, bad_b\n")
    assert "All configs completed successfully." not in out
    assert fake_popen[0].command[5:] == []


def test_real_children_fail_fast_and_succeed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))
    bad = write_config(tmp_path, "cfg_bad", complete=False, name="bad")
    ok = write_config(tmp_path, "cfg_ok")
    code = launch.launch_many([str(bad), str(ok)], ["--override=max_epochs=3"])
    out = capsys.readouterr().out
    assert code == 1, out
    # One process each: no rendezvous port worth showing.
    assert out.count("Launching: ") == 2 and not _launched_ports(out)
    assert "[cfg_bad] config error: " in out
    assert "[cfg_ok] fixture fit: max_epochs=3" in out
    assert out.endswith("\n\nFailed configs: cfg_bad\n")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "torchrun"),
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, None),
        ({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}, "slurm"),
        ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}, None),
        ({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1"}, None),
    ],
)
def test_an_existing_world_is_recognised(monkeypatch, env, expected):
    for key in list(os.environ):
        if key.startswith("SLURM_") or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert existing_world() == expected


def test_a_torchrun_rank_joins_its_world_and_keeps_its_rendezvous(monkeypatch, parallel):
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", "29555")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    seen = {}

    class Recording(FakeParallel):
        def __enter__(self):
            seen["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
            return self

    monkeypatch.setattr(launch.idist, "Parallel", Recording)
    with pytest.warns(UserWarning, match=r"\['master_port'\] from the config are ignored"):
        launch.launch(_cfg(master_port=1234))
    (instance,) = parallel
    assert instance.kwargs == {"backend": "gloo"}
    assert instance.runs == [(launch.run_task, (instance.runs[0][1][0],))]
    assert os.environ["MASTER_PORT"] == "29555"
    # Hidden while ignite builds the world, so it does not take its SLURM path; then restored.
    assert seen["slurm_job_id"] is None and os.environ["SLURM_JOB_ID"] == "7"


def test_a_joined_world_gets_the_dist_timeout_once_made(monkeypatch, parallel):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    events = []

    class Recording(FakeParallel):
        def __enter__(self):
            events.append("group made")
            return self

    monkeypatch.setattr(launch.idist, "Parallel", Recording)
    c10d = launch.torch.distributed.distributed_c10d
    monkeypatch.setattr(c10d, "_set_pg_timeout", lambda timeout: events.append(timeout))
    launch.launch(_cfg(dist_timeout=7))
    (instance,) = parallel
    # ignite's Parallel takes no timeout for a world it only joins.
    assert instance.kwargs == {"backend": "gloo"}
    assert events == ["group made", datetime.timedelta(seconds=7)]


@pytest.mark.parametrize(
    "marks, killed, shown",
    [
        # A rank failed: its peer is killed at once, when torch's join has named it.
        ((), True, "a rank ended with an error (reported below), so its peers are stopped: "),
        # The rank said why itself: a config error, or the preemption message.
        (("config_error-1",), True, None),
        (("preempted-0", "preempted-1"), False, None),
        # Both finished, one died in gloo's teardown: the other finishes, as torch asks.
        (("finished-0", "finished-1"), False, "stopped: SIGTERM to process "),
    ],
)
def test_torchs_terminating_line_kills_the_peer_of_a_failed_rank_and_says_so(
    tmp_path, marks, killed, shown
):
    from gatle_ignite.launch.ranks import RankMarks, _termination_explained

    for mark in marks:
        (tmp_path / mark).touch()
    said = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    logger = logging.getLogger("torch.multiprocessing.spawn")
    keep = Keep()
    logger.addHandler(keep)
    try:
        with _termination_explained(2, RankMarks(str(tmp_path))):
            logger.warning("Terminating process %s via signal SIGTERM", peer.pid)
        if killed:
            assert peer.wait() == -signal.SIGKILL
        else:
            assert peer.poll() is None
    finally:
        logger.removeHandler(keep)
        peer.kill()
        peer.wait()
    if shown is None:
        assert said == []
    else:
        (line,) = said
        assert shown in line
        assert line.endswith(f"process {peer.pid} killed" if killed else f"process {peer.pid}")


def test_a_one_process_child_is_launched_without_a_port_and_blank_lines_are_not_relayed(
    fake_popen, capsys, tmp_path, monkeypatch
):
    _gpus(monkeypatch, 0)
    alone = write_config(tmp_path, "alone")
    ranks = write_config(tmp_path, "ranks", nproc_per_node=2)
    monkeypatch.setattr(FakeChild, "lines", ["first\n", "\n", "   \n", "last\n"], raising=False)
    assert launch.launch_many([str(alone), str(ranks)]) == 0
    out = capsys.readouterr().out
    assert f"Launching: {alone}\n" in out
    assert len(_launched_ports(out)) == 1 and f"Launching: {ranks} (MASTER_PORT=" in out
    assert "[alone] \n" not in out and "[alone]    \n" not in out


def test_the_rendezvous_port_drawn_is_one_no_socket_holds(monkeypatch):
    from gatle_ignite.launch import world

    held = [socket.socket() for _ in range(3)]
    try:
        for sock in held:
            sock.bind(("", 0))
            sock.listen()
        ports = sorted(sock.getsockname()[1] for sock in held)
        free = ports[1]
        next(sock for sock in held if sock.getsockname()[1] == free).close()
        monkeypatch.setattr(world, "PORT_RANGE", ports)
        # Drawn blindly, two times in three the port would be taken and the rendezvous fail.
        assert [world.free_ports(1) for _ in range(20)] == [[free]] * 20
        with socket.socket() as last:
            last.bind(("", free))
            with pytest.raises(ConfigError, match="no free port in"):
                world.free_ports(1)
    finally:
        for sock in held:
            sock.close()
