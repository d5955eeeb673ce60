"""What a command imports: an optional extra only when the run uses it (a fact, not a time)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import HANG_S, ROOT, child_env
from tests.toy.config_file import write_toy_config

# The extras' packages, and what they pull in; a run that names none of them imports none.
EXTRAS = (
    "matplotlib",
    "optuna",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "safetensors",
    "mlflow",
    "wandb",
    "tensorboard",
    "sklearn",
    "scipy",
    "pandas",
    "psycopg",
    "sqlalchemy",
    "requests",
    "transformers",
)
# torch's sharded checkpoints: needed by an FSDP run or a .dcp file only (a fifth of a second).
SHARDED = "torch.distributed.checkpoint"

_RUN = """
import json, sys
from gatle_ignite.cli.main import main
code = main(sys.argv[2:])
json.dump({"code": code, "modules": sorted(sys.modules)}, open(sys.argv[1], "w"))
"""


def _imported(tmp_path, *argv) -> set:
    """The modules ``gatle-ignite ARGV`` left imported, run in a fresh process."""
    out = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", _RUN, str(out), *argv],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        timeout=HANG_S,
        check=True,
    )
    result = json.loads(out.read_text())
    assert result["code"] == 0
    return set(result["modules"])


def _optional(modules) -> list:
    return sorted(m for m in (*EXTRAS, SHARDED) if m in modules)


def test_config_and_its_dry_run_import_no_extra(tmp_path):
    # The dry run does what `config` does, then builds the trainer and runs a batch.
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"))
    assert _optional(_imported(tmp_path, "config", "--dry-run", f"--config={config}")) == []


def test_train_imports_no_extra_it_does_not_use(tmp_path):
    config = write_toy_config(
        tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), max_epochs=1, logger_name=["text"]
    )
    imported = _imported(tmp_path, "train", f"--config={config}")
    assert [m for m in EXTRAS if m in imported] == []


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="the tensorboard extra is absent"
)
def test_an_extra_the_run_uses_is_imported(tmp_path):
    # The negative control: the check above sees an extra once a run uses it.
    config = write_toy_config(
        tmp_path / "cfg.py",
        save_dir=str(tmp_path / "run"),
        max_epochs=1,
        logger_name=["tensorboard"],
    )
    assert "tensorboard" in _imported(tmp_path, "train", f"--config={config}")
