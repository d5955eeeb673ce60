"""Shared fixtures: a tiny task config, and the repository root on sys.path."""

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.toy.config import toy_config  # noqa: E402, F401  (re-exported for tests)

# One torch thread in the test process: the suite often runs on a busy machine, where a run
# with more would rightly warn that its threads outnumber the free cores. The tests of that
# warning set their own count.
torch.set_num_threads(1)

# How long a child process, or a wait for what it prints or writes, may take before a test takes
# it for hung. Not a speed check: a 2-rank run that takes 15 s on a quiet 2-core machine took
# 10 minutes at a load of 17, and a test may take longer, never fail for it. Fifteen minutes
# leaves that room while a real hang still fails inside CI's half hour.
HANG_S = 900


def free_port() -> int:
    """A TCP port that no process listens on, as the system picks one (a random one could be
    taken by another test run on the same machine)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env(**extra) -> dict:
    """The environment for a `gatle-ignite` child process: no world inherited from a launcher
    or SLURM, unbuffered output, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_gatle(*args, timeout: int = HANG_S) -> subprocess.CompletedProcess:
    """``python -m gatle_ignite ARGS`` in a child process from the source root, its output
    captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "gatle_ignite", *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# What a capped child may map: the interpreter, torch and a command's own work, far below what a
# command that trusts a hostile file would ask for.
CAPPED_BYTES = 6 << 30


def run_capped(argv: list) -> subprocess.CompletedProcess:
    """``argv`` in a child process with its address space capped and its time bounded (a hang
    guard, not a speed target): for a command that, broken, would take the machine's memory or
    wait forever. Its output is captured as text."""

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (CAPPED_BYTES, CAPPED_BYTES))

    return subprocess.run(
        argv,
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
        preexec_fn=cap_memory,
    )


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli("train", config, "resume=True", ...)`` -> (exit code, stdout, stderr), in-process."""
    from gatle_ignite.cli.main import main

    monkeypatch.chdir(ROOT)

    def run(command, config, *overrides, ckpt=None):
        args = [command, f"--config={config}", *(f"--override={o}" for o in overrides)]
        if ckpt is not None:
            args.append(f"--ckpt={ckpt}")
        code = main(args)
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def make_cfg(tmp_path):
    def make(**fields):
        fields.setdefault("save_dir", str(tmp_path / "run"))
        return toy_config(**fields)

    return make


@pytest.fixture
def count_stdout_writes(monkeypatch):
    """Call it in the test body to replace sys.stdout with one recording each write() call.

    In the body, not at fixture setup: pytest's capture sets its own sys.stdout again when the
    test call starts. Returns the list of written texts.
    """

    def install():
        writes = []

        class CountingStdout:
            def write(self, text):
                writes.append(text)

            def flush(self):
                pass

        monkeypatch.setattr("sys.stdout", CountingStdout())
        return writes

    return install


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of the module's own (tests.postgres_server), stopped after it."""
    from tests.postgres_server import PostgresServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed (PG_BINDIR to point at them)")
    server = PostgresServer(bindir).start()
    try:
        yield server
    finally:
        server.stop()


def no_process_left(group) -> bool:
    """Whether every process of a child's session (``group``) ends by itself (within HANG_S:
    a loaded machine can take long to end them); any left then are killed."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)
    return False
