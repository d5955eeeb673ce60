"""TensorBoard event files under ``<save_dir>/tensorboard/``."""

import numbers
import os

from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.callbacks.logging import import_extra
from gatle_ignite.run.storage import local_dir

__all__ = ["Backend"]


class Backend(BaseBackend):
    """One scalar per metric: iteration-level ones at their step, epoch-level ones at the epoch."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.summary = import_extra("torch.utils.tensorboard", "tensorboard")
        self.log_dir = os.path.join(local_dir(cfg.save_dir), "tensorboard")
        self.writer = self.summary.SummaryWriter(log_dir=self.log_dir)

    def log(self, metrics, step=None, epoch=None):
        at = step if step is not None else epoch
        for name, value in metrics.items():
            # A scalar plot cannot hold a list-valued metric (a confusion matrix, ...).
            if isinstance(value, numbers.Real):
                self.writer.add_scalar(name, value, global_step=at)
        # So a crash or a kill loses nothing already logged.
        self.writer.flush()

    def rewind(self, step):
        # TensorBoard hides the events from purge_step on, in every file of the directory.
        self.writer.close()
        self.writer = self.summary.SummaryWriter(log_dir=self.log_dir, purge_step=step + 1)

    def finish(self, failed=False):
        self.writer.close()
