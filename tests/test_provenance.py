"""How each run was made: run.json records the code, the packages, the command and the machine
of every process that started or resumed it, and a resume on other code says so."""

import hashlib
import json
import platform
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import ignite
import pytest
import torch

import gatle_ignite
from gatle_ignite.redaction import redact_argv
from gatle_ignite.run.layout import MANIFEST_FILE
from tests.toy.config import toy_config
from tests.toy.trainer import Trainer


def _git(repo, *args) -> str:
    command = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args]
    return subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A project that is a git checkout with one commit, as the working directory."""
    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q")
    (project / "model.py").write_text("WIDTH = 4\n")
    _git(project, "add", "model.py")
    _git(project, "commit", "-qm", "first")
    monkeypatch.chdir(project)
    return project


def _train(save_dir, **fields) -> dict:
    Trainer(0, toy_config(save_dir=str(save_dir), **fields)).fit()
    return json.loads((Path(save_dir) / MANIFEST_FILE).read_text())


def _head(repo) -> str:
    return _git(repo, "rev-parse", "HEAD").strip()


def test_a_run_in_a_clean_checkout_records_its_commit_versions_and_command(repo):
    # The run's own files inside the tree are untracked: they leave it clean.
    [start] = _train(repo / "runs" / "toy")["provenance"]
    assert start["git"] == {"commit": _head(repo), "dirty": False}
    assert start["versions"] == {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ignite": ignite.__version__,
        "gatle_ignite": gatle_ignite.__version__,
    }
    assert (start["action"], start["iteration"], start["world_size"]) == ("fresh", 0, 1)
    assert (start["host"], start["cwd"]) == (socket.gethostname(), str(repo))
    assert start["command"] == sys.argv
    assert start["until"] >= start["started"]


def test_a_dirty_checkout_is_recorded_with_the_hash_of_its_diff(repo):
    (repo / "model.py").write_text("WIDTH = 8\n")
    (repo / "notes.txt").write_text("untracked files do not count\n")
    git = _train(repo / "runs" / "toy")["provenance"][0]["git"]
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=repo, capture_output=True)
    assert git == {
        "commit": _head(repo),
        "dirty": True,
        "diff_sha256": "sha256:" + hashlib.sha256(diff.stdout).hexdigest()[:16],
    }


def test_outside_a_checkout_or_without_git_there_is_no_git_entry(repo, tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.chdir(plain)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    start = _train(plain / "run")["provenance"][0]
    assert "git" not in start and start["versions"]["torch"] == torch.__version__
    # In the checkout, but with no git to ask.
    monkeypatch.chdir(repo)
    empty = tmp_path / "no-tools"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert "git" not in _train(repo / "run")["provenance"][0]


def _resume(save_dir, **fields) -> tuple:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manifest = _train(save_dir, resume=True, **fields)
    said = [str(w.message) for w in caught if "other code" in str(w.message)]
    return manifest, said


def test_a_resume_on_another_commit_warns_and_keeps_how_the_run_began(repo):
    save_dir = repo / "runs" / "toy"
    first = _train(save_dir, max_epochs=1)["provenance"][0]
    began = _head(repo)
    # The negative control: the same code resumes without a word.
    manifest, said = _resume(save_dir, max_epochs=2)
    assert said == [] and len(manifest["provenance"]) == 2
    (repo / "model.py").write_text("WIDTH = 16\n")
    _git(repo, "commit", "-qam", "wider")
    manifest, said = _resume(save_dir, max_epochs=3)
    assert len(said) == 1
    assert f"commit {began[:12]} then, commit {_head(repo)[:12]} now" in said[0]
    assert str(save_dir) in said[0]
    starts = manifest["provenance"]
    assert {k: v for k, v in starts[0].items() if k != "until"} == {
        k: v for k, v in first.items() if k != "until"
    }
    assert [(s["action"], s["iteration"]) for s in starts] == [
        ("fresh", 0),
        ("resume", 4),
        ("resume", 8),
    ]
    assert starts[2]["git"]["commit"] == _head(repo) != began


def test_a_resume_with_uncommitted_changes_warns_too(repo):
    save_dir = repo / "runs" / "toy"
    _train(save_dir, max_epochs=1)
    (repo / "model.py").write_text("WIDTH = 32\n")
    _manifest, said = _resume(save_dir, max_epochs=2)
    assert len(said) == 1 and "now" in said[0] and "with uncommitted changes (sha256:" in said[0]


def test_a_run_from_before_provenance_resumes_and_gets_its_record(repo):
    save_dir = repo / "runs" / "toy"
    manifest = _train(save_dir, max_epochs=1)
    del manifest["provenance"]
    (save_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
    resumed, said = _resume(save_dir, max_epochs=2)
    assert said == [] and resumed["state"] == "completed"
    assert [s["action"] for s in resumed["provenance"]] == ["resume"]


SECRET_ARGV = [
    "gatle-ignite",
    "train",
    "--config=configs/run_v0.py",
    "--override=wandb_api_key=LEAK-1",
    "--override",
    "discord_url=https://hooks.invalid/LEAK-2",
    "--override=model_params.source=https://user:LEAK-3@host.invalid/data",
    "--token",
    "LEAK-4",
    "--api-key=LEAK-5",
    "--override=optimizer_params.lr=0.1",
]


def test_the_recorded_command_has_its_secrets_redacted(repo, monkeypatch):
    shown = redact_argv(SECRET_ARGV)
    assert "LEAK" not in " ".join(shown)
    assert shown[:3] == SECRET_ARGV[:3] and shown[-1] == "--override=optimizer_params.lr=0.1"
    assert shown[3] == "--override=wandb_api_key=<redacted>"
    assert shown[6] == "--override=model_params.source=https://<redacted>@host.invalid/data"
    monkeypatch.setattr(sys, "argv", SECRET_ARGV)
    _train(repo / "runs" / "toy")
    text = (repo / "runs" / "toy" / MANIFEST_FILE).read_text()
    assert "LEAK" not in text and "optimizer_params.lr=0.1" in text
