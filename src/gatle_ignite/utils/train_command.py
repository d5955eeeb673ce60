"""Whether a training run is the ``gatle-ignite train`` command's, or a script's ``fit()``.

The command marks its process for as long as it trains, through the environment, so that the
ranks it spawns (and each rank torchrun or srun starts with the command) carry the mark too.
Under it a run leaves its end line to the command's summary, and a fresh run is refused a
``save_dir`` holding another run. A script calling ``fit()`` keeps 0.4's ways: it trains beside
that run and records nothing there.
"""

import contextlib
import os

__all__ = ["TRAIN_COMMAND_VAR", "train_command", "under_train_command"]

TRAIN_COMMAND_VAR = "GATLE_IGNITE_TRAIN_COMMAND"


def under_train_command() -> bool:
    """Whether this process trains for ``gatle-ignite train``."""
    return os.environ.get(TRAIN_COMMAND_VAR) == "1"


@contextlib.contextmanager
def train_command():
    """Around the run ``gatle-ignite train`` starts: the mark, then the environment as it was."""
    previous = os.environ.get(TRAIN_COMMAND_VAR)
    os.environ[TRAIN_COMMAND_VAR] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(TRAIN_COMMAND_VAR, None)
        else:
            os.environ[TRAIN_COMMAND_VAR] = previous
