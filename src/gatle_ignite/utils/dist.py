"""Rank-aware output: framework lines are printed once per run, by rank 0."""

import logging

import ignite.distributed as idist
from ignite.utils import setup_logger

from gatle_ignite.redaction import redact_text

__all__ = ["quiet_ignite_loggers", "rank_zero_print"]

# ignite's own INFO lines (the loader kwargs, the DDP wrap, the process group, EarlyStopping's
# "Stop training", which the framework's [early-stop] line says already): each is made by
# setup_logger, which keeps the level of a logger that already exists.
_IGNITE_LOGGERS = (
    "ignite.handlers.early_stopping.EarlyStopping",
    "ignite.distributed.auto.auto_dataloader",
    "ignite.distributed.auto.auto_model",
    "ignite.distributed.launcher.Parallel",
    "ignite.distributed.utils",
)


def rank_zero_print(*args, **kwargs) -> None:
    if idist.get_rank() == 0:
        print(*args, **kwargs)


class _NotTheTraceback(logging.Filter):
    """Drops ignite's "run is terminating due to exception" lines: the exception that follows
    says the same, with its traceback (or, for a config error, the fix)."""

    def filter(self, record) -> bool:
        return "is terminating due to exception" not in record.getMessage()


class _Redacted(logging.Filter):
    """ignite's echo of an exception may quote a URL, with its credentials."""

    def filter(self, record) -> bool:
        record.msg, record.args = redact_text(record.getMessage()), None
        return True


_ENGINE_LOGGER = logging.getLogger("ignite.engine.engine.Engine")
_TERMINATING = _NotTheTraceback()
_REDACTED = _Redacted()


def quiet_ignite_loggers(verbosity: int) -> None:
    """ignite's INFO lines and its echo of an exception only at ``verbosity`` 2."""
    level = logging.INFO if verbosity >= 2 else logging.WARNING
    for name in _IGNITE_LOGGERS:
        setup_logger(name, level=level, distributed_rank=0).setLevel(level)
    _ENGINE_LOGGER.addFilter(_REDACTED)
    if verbosity >= 2:
        _ENGINE_LOGGER.removeFilter(_TERMINATING)
    else:
        _ENGINE_LOGGER.addFilter(_TERMINATING)
