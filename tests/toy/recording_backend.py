"""A custom backend that records what it was told, for tests."""

from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.callbacks.run_record import config_payload

LOGGED = []
WATCHED = []
FINISHED = []
# The config as a custom backend is told to record it: the redacted payload.
CONFIGS = []


class Backend(BaseBackend):
    def __init__(self, cfg):
        super().__init__(cfg)
        CONFIGS.append(config_payload(cfg))

    def log(self, metrics, step=None, epoch=None):
        LOGGED.append((dict(metrics), step, epoch))

    def watch(self, model):
        WATCHED.append(model)

    def finish(self, failed=False):
        FINISHED.append(failed)
