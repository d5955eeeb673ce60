"""A sum of the seconds spent inside ``with`` blocks, read at an epoch's end."""

import time

__all__ = ["Stopwatch"]


class Stopwatch:
    """``with stopwatch: ...`` adds the block's wall time to ``seconds``; ``start`` and
    ``stop`` do the same for a span opened and closed by two events."""

    def __init__(self):
        self.seconds = 0.0
        self._started = None

    def start(self, *_args) -> None:
        self._started = time.perf_counter()

    def stop(self, *_args) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()
