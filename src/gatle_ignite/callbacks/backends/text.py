"""The default sink: metrics pretty-printed to stdout."""

import pprint

from gatle_ignite.callbacks.logging import Backend as BaseBackend

__all__ = ["Backend"]


class Backend(BaseBackend):
    def log(self, metrics, step=None, epoch=None):
        print(f"--- epoch {epoch} ---" if epoch is not None else f"--- step {step} ---")
        pprint.pprint(metrics)
