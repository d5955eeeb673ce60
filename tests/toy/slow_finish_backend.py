"""A custom backend whose ``finish()`` takes long, as a W&B or MLflow upload at a run's end can.

``finish()`` first creates the file named by the config's ``slow_finish_marker``, so a test
knows the process is in its teardown and can kill it there.
"""

import time
from pathlib import Path

from gatle_ignite.callbacks.logging import Backend as BaseBackend

SECONDS = 600


class Backend(BaseBackend):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.marker = Path(cfg.slow_finish_marker)

    def log(self, metrics, step=None, epoch=None):
        pass

    def finish(self, failed=False):
        self.marker.write_text("finishing\n")
        time.sleep(SECONDS)
