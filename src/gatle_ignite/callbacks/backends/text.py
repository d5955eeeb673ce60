"""The default sink: metrics pretty-printed to stdout."""

import pprint
import sys

from gatle_ignite.callbacks.logging import Backend as BaseBackend

__all__ = ["Backend"]


class Backend(BaseBackend):
    def log(self, metrics, step=None, epoch=None):
        header = f"--- epoch {epoch} ---" if epoch is not None else f"--- step {step} ---"
        # One write for the block: unbuffered, print() and pprint() make a system call a piece.
        # Like print(), nothing when the process has no stdout (a daemon, pythonw).
        if sys.stdout is not None:
            sys.stdout.write(f"{header}\n{pprint.pformat(metrics)}\n")
