"""Where the causal_lm example keeps things on disk: the only module that knows paths."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = PROJECT_ROOT / "checkpoints"


def ckpt_dir(name):
    """The checkpoint directory of the run called ``name``."""
    return str(CHECKPOINTS / name)
