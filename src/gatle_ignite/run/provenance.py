"""How a run was made: the code, the packages, the command and the machine, kept in run.json.

Rank 0 gathers one record each time a process starts the run or resumes it; the run keeps them
all, the first one being how it began. Git is asked with a timeout, and outside a checkout
or without git the ``git`` entry is simply absent.
"""

import hashlib
import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from typing import Optional

import ignite
import ignite.distributed as idist
import torch

from gatle_ignite._version import __version__
from gatle_ignite.redaction import redact_argv

__all__ = ["GIT_TIMEOUT_S", "code_change", "gather", "git_state", "versions"]

# Seconds each git command may take: a hung network file system must not hold up a start for
# good, yet a loaded machine, where starting git alone can take seconds, must not lose the entry.
GIT_TIMEOUT_S = 60


def gather(action: str, iteration: int = 0) -> dict:
    """The record of this process starting (``fresh``) or resuming (``resume``) the run."""
    record = {
        "action": action,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "iteration": iteration,
        "command": redact_argv(sys.argv),
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "world_size": idist.get_world_size(),
        "versions": versions(),
    }
    git = git_state(os.getcwd())
    if git is not None:
        record["git"] = git
    return record


def versions() -> dict:
    """The versions of Python, torch, ignite and gatle-ignite, and of CUDA and cuDNN when there."""
    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ignite": ignite.__version__,
        "gatle_ignite": __version__,
    }
    if torch.version.cuda:
        found["cuda"] = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn:
        found["cudnn"] = cudnn
    return found


def _git(directory, *args) -> Optional[bytes]:
    # No optional locks: asking must never block, or be blocked by, the user's own git.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=directory,
            env=env,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def git_state(directory) -> Optional[dict]:
    """``{commit, dirty, diff_sha256}`` of the checkout holding ``directory``; None outside one.

    Dirty means a tracked file differs from the commit; untracked files do not count, since a
    run's own outputs often lie inside the tree. ``diff_sha256`` hashes ``git diff HEAD``.
    """
    commit = _git(directory, "rev-parse", "HEAD")
    if commit is None:
        return None
    state = {"commit": commit.decode().strip()}
    status = _git(directory, "status", "--porcelain", "--untracked-files=no")
    if status is None:
        return state
    state["dirty"] = bool(status.strip())
    if state["dirty"]:
        diff = _git(directory, "diff", "HEAD", "--binary")
        if diff is not None:
            state["diff_sha256"] = "sha256:" + hashlib.sha256(diff).hexdigest()[:16]
    return state


def _code(record: dict) -> Optional[tuple]:
    git = record.get("git")
    if not git:
        return None
    return git.get("commit"), git.get("diff_sha256")


def _describe_code(git: dict) -> str:
    changes = f" with uncommitted changes ({git['diff_sha256']})" if git.get("diff_sha256") else ""
    return f"commit {git.get('commit', '?')[:12]}{changes}"


def code_change(began: dict, now: dict) -> Optional[str]:
    """What differs between the code a run began with and the code resuming it; None when
    both are the same, or either is unknown."""
    before, after = _code(began), _code(now)
    if before is None or after is None or before == after:
        return None
    return f"{_describe_code(began['git'])} then, {_describe_code(now['git'])} now"
