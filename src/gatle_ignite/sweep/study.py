"""The Optuna study behind a sweep: where it is stored, and how it samples and prunes.

By default the study is a journal file inside the sweep directory (``study.journal``), which
needs no server and which several processes append to safely (Optuna's FAQ advises against
SQLite for parallel work). ``--storage`` takes any URL Optuna's RDB storage takes; a plain
``postgresql://`` goes through the installed driver (psycopg 3), so that workers on many machines
share one study.
"""

import contextlib
import random
import time
import warnings
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.redaction import redact_text
from gatle_ignite.sweep.reconnect import DEFAULT_RETRY_S, StorageUnreachable, reconnecting_storage

__all__ = [
    "JOURNAL_FILE",
    "build_pruner",
    "build_sampler",
    "direction_of",
    "finished_states",
    "open_storage",
    "require_optuna",
    "storage_url",
    "where_stored",
]

JOURNAL_FILE = "study.journal"
# Tries at opening a database whose tables other workers are making at the same moment.
_OPEN_ATTEMPTS = 5
_INSTALL = 'pip install "gatle-ignite[sweep]"'


def require_optuna():
    """The optuna module; a missing one is a config error naming the extra."""
    try:
        import optuna
    except ImportError:
        raise ConfigError(f"a sweep needs Optuna, which is not installed.\n  {_INSTALL}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def storage_url(url: str) -> str:
    """``url`` with a plain ``postgresql://`` (or ``postgres://``) mapped to psycopg 3."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url


def where_stored(sweep_dir, url: Optional[str]) -> dict:
    """How a process finds the study: ``{"journal": path}`` or ``{"url": url}`` (secret)."""
    if url:
        return {"url": storage_url(url)}
    return {"journal": str((Path(sweep_dir) / JOURNAL_FILE).absolute())}


def shown_storage(where: dict) -> str:
    """The storage as messages and records may show it: credentials redacted."""
    return where["journal"] if "journal" in where else redact_text(where["url"])


def open_storage(where: dict, retry_s: Optional[float] = None, retry_opening: bool = False):
    """The Optuna storage ``where`` names; a driver or a server missing is a config error.

    A database's every call is retried for ``retry_s`` seconds (default ``DEFAULT_RETRY_S``)
    while its connection is lost (``sweep.reconnect``); its opening too when ``retry_opening``
    (a trial opens a study its sweep has opened, so a server down then is only restarting).
    """
    optuna = require_optuna()
    if "journal" in where:
        from gatle_ignite.sweep.journal import journal_backend

        return optuna.storages.JournalStorage(journal_backend(where["journal"]))
    url = where["url"]
    try:
        return reconnecting_storage(
            lambda: _rdb_storage(optuna, url),
            DEFAULT_RETRY_S if retry_s is None else retry_s,
            redact_text(url),
            retry_opening,
        )
    except StorageUnreachable:
        raise
    except ImportError as error:
        raise ConfigError(
            f"the storage {redact_text(url)} needs a database driver that is not installed "
            f"({error}).\n  {_INSTALL} installs psycopg for PostgreSQL."
        ) from None
    except Exception as error:
        first = redact_text(str(error).splitlines()[0] if str(error) else type(error).__name__)
        raise ConfigError(
            f"cannot open the study storage {redact_text(url)}: {first}\n"
            f"  Check that the server is up and the URL names a database this user may use."
        ) from None


def _rdb_storage(optuna, url: str):
    """Optuna's RDB storage at ``url``, its tables made if the database has none.

    Workers started together on a fresh database all make the tables at once, and all but one
    collide (a duplicate type or table); the next try finds them made.
    """
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    # Pings a pooled connection before use: a long trial outlives a server's idle timeout.
    options = {"pool_pre_ping": True}
    for _attempt in range(_OPEN_ATTEMPTS - 1):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=options)
        except (IntegrityError, ProgrammingError):
            time.sleep(random.uniform(0.05, 0.5))
    return optuna.storages.RDBStorage(url, engine_kwargs=options)


def build_sampler(name: str, space: dict):
    """The sampler ``name`` (tpe, random, grid) over ``space`` ({key: Param})."""
    optuna = require_optuna()
    if name == "random":
        return optuna.samplers.RandomSampler()
    if name == "grid":
        return _grid_sampler({key: list(param.choices) for key, param in space.items()})
    return optuna.samplers.TPESampler()


def _grid_sampler(grid: dict):
    optuna = require_optuna()

    class Grid(optuna.samplers.GridSampler):
        """Optuna's grid without its stop at the grid's end: that calls ``Study.stop``, which
        works only inside ``Study.optimize``. The sweep stops at its trial count, which is at
        most the grid's size."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return Grid(grid)


def build_pruner(name: str, params: Optional[dict] = None):
    """The pruner ``name`` (median, hyperband, none) with Optuna's arguments ``params``."""
    optuna = require_optuna()
    params = dict(params or {})
    classes = {
        "median": optuna.pruners.MedianPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "none": optuna.pruners.NopPruner,
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return classes[name](**params)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"pruner_params {params!r} do not fit the {name} pruner: {error}\n"
            f"  They are the arguments of Optuna's {classes[name].__name__}."
        ) from None


def direction_of(score_factor) -> str:
    """``maximize`` for a score the config maximises (score_factor > 0), else ``minimize``."""
    return "minimize" if (score_factor or 1) < 0 else "maximize"


def finished_states() -> tuple:
    state = require_optuna().trial.TrialState
    return (state.COMPLETE, state.PRUNED, state.FAIL)


@contextlib.contextmanager
def quiet_optuna():
    """Optuna's experimental and duplicate-report warnings are about its API, not the user's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="optuna")
        yield
