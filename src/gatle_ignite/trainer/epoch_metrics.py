"""The training engine's epoch metrics in an iteration checkpoint, so a resumed epoch reports
what an uninterrupted one would.

A metric attached to the trainer (the loss averages, ``train_metrics``) accumulates over the
epoch. An iteration checkpoint holds each one's state; a resume restores it once the resumed
epoch has started (after the metrics reset themselves for it), so the epoch's values cover every
iteration of the epoch, those before the interruption too.
"""

import warnings

from ignite.engine import Events
from ignite.metrics import Metric

__all__ = ["EPOCH_METRICS_KEY", "EpochMetrics"]

# The checkpoint key; iteration checkpoints only, an epoch's own checkpoint has nothing pending.
EPOCH_METRICS_KEY = "epoch_metrics"


class EpochMetrics:
    """``state_dict`` / ``load_state_dict`` of the metrics (name -> ignite Metric) an engine
    accumulates over an epoch. A metric that cannot give its state is left out, with one
    warning: its value for a resumed epoch covers only the iterations after the resume."""

    def __init__(self, engine, metrics):
        self.engine = engine
        self.metrics = metrics
        self._unsaved = set()
        self._loaded = None

    def state_dict(self) -> dict:
        states = {}
        for name, metric in self.metrics().items():
            if name in self._unsaved:
                continue
            try:
                states[name] = _state_of(metric)
            except (NotImplementedError, TypeError, ValueError) as error:
                self._unsaved.add(name)
                warnings.warn(
                    f"train metric {name!r} cannot be checkpointed ({error}); after a "
                    f"mid-epoch resume its value for that epoch covers only the iterations "
                    f"after the resume.\n  Give it a state_dict / load_state_dict, or name the "
                    f"attributes it accumulates in _state_dict_all_req_keys (ignite's way).",
                    stacklevel=2,
                )
        return states

    def load_state_dict(self, state_dict) -> None:
        """Held until the resumed epoch starts: ignite resets each metric at that moment."""
        self._loaded = dict(state_dict)
        if not self.engine.has_event_handler(self._restore, Events.EPOCH_STARTED):
            self.engine.add_event_handler(Events.EPOCH_STARTED, self._restore)

    def _restore(self, engine) -> None:
        # Kept attached (removing a handler while its event fires skips the next one).
        loaded, self._loaded = self._loaded, None
        length = engine.state.epoch_length
        if not loaded or not length or engine.state.iteration % length == 0:
            return
        for name, metric in self.metrics().items():
            if name not in loaded:
                continue
            try:
                metric.load_state_dict(loaded[name])
            except (ValueError, KeyError, TypeError) as error:
                warnings.warn(
                    f"train metric {name!r} could not be restored ({error}); its value for "
                    f"the resumed epoch covers only the iterations after the resume.",
                    stacklevel=2,
                )


def _state_of(metric):
    """The metric's state; ignite's own state_dict on a metric that names no attribute would
    return nothing and restore nothing, silently."""
    own = type(metric).state_dict is not Metric.state_dict
    if not own and not getattr(metric, "_state_dict_all_req_keys", ()):
        raise NotImplementedError(f"{type(metric).__name__} names no _state_dict_all_req_keys")
    return metric.state_dict()
