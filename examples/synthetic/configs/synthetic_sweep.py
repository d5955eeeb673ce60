"""A sweep of the v0 config: its learning rate and width, reviewed and versioned like a config.

    gatle-ignite sweep --sweep=<this file> [--workers 2]

A flag given on the command line wins over the field here (``--trials 4``).
"""

import os
from pathlib import Path

from examples.synthetic.configs.base_utils import ckpt_dir


def get_sweep():
    """The sweep's fields: the config, the space, how many trials and how they are searched."""
    return {
        # Relative to where the command runs, so the printed commands stay short.
        "config": os.path.relpath(Path(__file__).with_name("synthetic_v0.py")),
        "dir": ckpt_dir(Path(__file__).stem),
        "trials": 12,
        "params": {
            "optimizer_params.lr": "loguniform(1e-4, 1e-2)",
            "model_params.hidden": [64, 128, 256],
        },
        "overrides": {"max_epochs": 5},
        "pruner": "median",
        "pruner_params": {"n_startup_trials": 3},
        # Tried first: the config's own values, as the baseline every other trial must beat.
        "enqueue": [{"optimizer_params.lr": 1e-3, "model_params.hidden": 128}],
    }
