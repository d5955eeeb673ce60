"""A custom backend that records what it was told, for tests."""

from gatle_ignite.callbacks.logging import Backend as BaseBackend

LOGGED = []
WATCHED = []
FINISHED = []


class Backend(BaseBackend):
    def log(self, metrics, step=None, epoch=None):
        LOGGED.append((dict(metrics), step, epoch))

    def watch(self, model):
        WATCHED.append(model)

    def finish(self, failed=False):
        FINISHED.append(failed)
