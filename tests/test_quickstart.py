"""The README's quick start: `make train` and `make test` set up their environment only when
needed, install exactly what the README says, and CI runs the same test command.

Checked with `make -n`, which prints the commands a target would run without running any, on a
stand-in environment directory: nothing is installed here."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import HANG_S, ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

README = (ROOT / "README.md").read_text()
TRAIN = (
    "gatle-ignite train --config=examples/synthetic/configs/synthetic_v0.py "
    "--override replace_run=True"
)
# Each target and the command it runs once the environment is set up.
RUNS = [("train", TRAIN), ("test", "python -m pytest")]
# What `make train` installs: training the synthetic example needs no extra.
LIGHT = ["pip install torch==2.13.0", "pip install -e ."]
STAMPS = {"train": ".gatle-ignite-trainable", "test": ".gatle-ignite-installed"}


def _pip_lines(text: str) -> list[str]:
    """The ``pip install`` lines of ``text``, in order, without their comments."""
    return [
        line.split("#")[0].strip()
        for line in text.splitlines()
        if line.lstrip().startswith("pip install")
    ]


def _readme_install_lines() -> list[str]:
    """The pip lines of the README's manual install, in order."""
    return _pip_lines(README.split("## Quick start", 1)[1].split("## Install", 1)[0])


def _dry_run(target: str, venv: Path) -> list[str]:
    """The commands ``make <target>`` would run with ``VENV=venv``, one per line."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=True,
    )
    # A recipe line continued with a backslash is one command.
    return done.stdout.replace("\\\n", " ").splitlines()


def _environment(tmp_path, installed_after_pyproject: bool, stamps=None):
    """A stand-in environment with install stamps newer or older than pyproject.toml (a full
    install writes both)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    pyproject = (ROOT / "pyproject.toml").stat().st_mtime
    offset = 60 if installed_after_pyproject else -60
    for name in STAMPS.values() if stamps is None else stamps:
        (venv / name).touch()
        os.utime(venv / name, (pyproject + offset, pyproject + offset))
    return venv


def _squeeze(command: str) -> str:
    return re.sub(r"\s+", " ", command).strip()


@pytest.mark.parametrize(("target", "command"), RUNS)
def test_a_set_up_environment_is_not_installed_again(tmp_path, target, command):
    commands = [_squeeze(c) for c in _dry_run(target, _environment(tmp_path, True))]
    assert len(commands) == 1 and commands[0].endswith(command)
    assert not any("pip install" in c or "-m venv" in c for c in commands)


@pytest.mark.parametrize(("target", "command"), RUNS)
def test_a_changed_pyproject_installs_again_before_running(tmp_path, target, command):
    venv = _environment(tmp_path, installed_after_pyproject=False)
    commands = [_squeeze(c) for c in _dry_run(target, venv)]
    installs = [c.split(" -m ", 1)[1] for c in commands if " -m pip install" in c]
    assert installs == (LIGHT if target == "train" else _readme_install_lines())
    assert commands[-2].startswith(f"touch {venv}/{STAMPS[target]}")
    assert commands[-1].endswith(command)
    assert not any("-m venv" in c for c in commands)


def test_make_test_after_make_train_completes_the_install(tmp_path):
    venv = _environment(tmp_path, True, stamps=[STAMPS["train"]])
    assert _squeeze(_dry_run("train", venv)[-1]).endswith(TRAIN)
    commands = [_squeeze(c) for c in _dry_run("test", venv)]
    installs = [c.split(" -m ", 1)[1] for c in commands if " -m pip install" in c]
    assert installs == _readme_install_lines()


def test_the_readme_says_what_make_train_installs():
    quick_start = README.split("## Quick start", 1)[1].split("## Install", 1)[0]
    assert all(f"`{line}`" in quick_start for line in LIGHT)


def test_a_missing_environment_is_created_first(tmp_path):
    venv = tmp_path / "fresh"
    commands = [_squeeze(c) for c in _dry_run("train", venv)]
    assert commands[0].endswith(f"-m venv {venv}")
    assert sum(" -m pip install" in c for c in commands) == 2
    assert commands[-1].endswith(TRAIN)


def test_the_readme_states_the_install_the_makefile_runs():
    assert _readme_install_lines() == [
        "pip install torch==2.13.0",
        'pip install -e ".[dev,examples,all,docs]"',
    ]
    quick_start = README.split("## Quick start", 1)[1].split("## Install", 1)[0]
    assert "make train" in quick_start and "make test" in quick_start


def test_getting_started_states_the_same_source_install():
    page = (ROOT / "docs" / "getting-started.md").read_text()
    # The first code block after the sentence that introduces the source install.
    block = page.split("From a source checkout", 1)[1].split("```", 2)[1]
    assert _pip_lines(block) == _readme_install_lines()


def test_ci_sets_up_and_tests_through_the_same_targets():
    script = (ROOT / ".ci" / "run").read_text()
    assert 'make install VENV="$VENV"' in script
    assert 'make test VENV="$VENV"' in script
    assert "mktemp -d" in script  # a fresh environment each run
