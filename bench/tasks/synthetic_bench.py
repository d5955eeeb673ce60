"""The synthetic example as the benchmarks run it: 20 epochs, no scheduler, a timed trainer."""

import os
import tempfile

from examples.synthetic.configs.synthetic_v0 import get_config as synthetic_config


def get_config():
    cfg = synthetic_config()
    cfg.name = "synthetic_bench"
    # The benchmarks override it with a fresh directory per run; never the example's own.
    cfg.save_dir = os.path.join(tempfile.gettempdir(), "gatle-bench", cfg.name)
    cfg.main_runner = "bench.tasks.trainer"
    # A scheduler is not one of the defaults, and without it every variant does the same math.
    cfg.lr_scheduler = None
    cfg.max_epochs = 20
    return cfg
