"""A sink of 0.4's protocol: no base class, only ``log``, ``watch`` and ``finish``."""

LOGGED = []


class Backend:
    def __init__(self, cfg):
        self.cfg = cfg

    def log(self, metrics, step=None, epoch=None):
        LOGGED.append((dict(metrics), step, epoch))

    def watch(self, model):
        pass

    def finish(self, failed=False):
        pass
