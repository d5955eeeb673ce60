"""A sweep's Optuna study, read from the sweep's directory, drawn with Optuna's own plots.

Optuna is optional (the ``sweep`` extra) and imported only here, when a sweep is drawn.
"""

import sys
import warnings
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.redaction import REDACTED
from gatle_ignite.run.filesystem import UnsafeFile, open_regular
from gatle_ignite.sweep.record import RECORD_FILE, SweepRecord
from gatle_ignite.sweep.study import open_storage, where_stored

__all__ = ["STUDY_PLOTS", "has_study", "load_study", "require_optuna", "write_study_plots"]

# The file suffix of each plot, and the function of optuna.visualization.matplotlib drawing it.
STUDY_PLOTS = (
    ("history", "plot_optimization_history"),
    ("importance", "plot_param_importances"),
    ("parallel", "plot_parallel_coordinate"),
)


def has_study(sweep_dir) -> bool:
    """Whether ``sweep_dir`` is a sweep's directory (``gatle-ignite sweep`` wrote its record)."""
    return (Path(sweep_dir) / RECORD_FILE).is_file()


def require_optuna(sweep_dir):
    """The optuna module, or a config error naming the extra that installs it."""
    try:
        import optuna
        import optuna.visualization.matplotlib  # noqa: F401  (the plots below)
    except ImportError as error:
        raise ConfigError(
            f"{sweep_dir} is a sweep, and its study's plots are drawn by Optuna, which is not "
            f"installed ({error}).\n"
            f'  Install it with `pip install "gatle-ignite[sweep]"`.'
        ) from error
    return optuna


def load_study(sweep_dir, storage: Optional[str] = None):
    """The Optuna study of the sweep in ``sweep_dir``: in its journal file, or in the database
    ``storage`` names (its record keeps that URL without its credentials)."""
    optuna = require_optuna(sweep_dir)
    record = SweepRecord.read(sweep_dir)
    where = where_stored(sweep_dir, storage or _recorded_url(record))
    if "journal" in where:
        _check_journal(Path(where["journal"]))
    return optuna.load_study(study_name=record.study, storage=open_storage(where))


def _check_journal(path: Path) -> None:
    """Refuse a journal Optuna would wait on or read from elsewhere: a FIFO, a device, a link out
    of the sweep directory (its size is the study's own)."""
    try:
        open_regular(path, limit=sys.maxsize).close()
    except FileNotFoundError:
        return
    except (OSError, UnsafeFile) as error:
        raise ConfigError(f"the sweep's study journal {path} cannot be read: {error}.") from None


def _recorded_url(record: SweepRecord) -> Optional[str]:
    url = record.storage
    if "://" not in url:
        return None  # the sweep's own journal file
    if REDACTED in url:
        raise ConfigError(
            f"the sweep's study is in {url}, whose credentials are not recorded.\n"
            f"  Pass the URL with them: --storage URL."
        )
    return url


def write_study_plots(sweep_dir, stem: str, storage: Optional[str] = None) -> list:
    """Write ``<stem>_history.png``, ``<stem>_importance.png`` and ``<stem>_parallel.png``; a
    plot Optuna cannot draw yet (too few finished trials) is skipped with a warning. Returns the
    paths written."""
    optuna = require_optuna(sweep_dir)
    study = load_study(sweep_dir, storage)
    import matplotlib.pyplot as plt

    written = []
    for suffix, function in STUDY_PLOTS:
        draw = getattr(optuna.visualization.matplotlib, function)
        path = Path(f"{stem}_{suffix}.png")
        before = set(plt.get_fignums())
        try:
            with warnings.catch_warnings():
                # Optuna marks its matplotlib plots experimental on every call.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                axes = draw(study)
        except (ValueError, RuntimeError) as error:
            warnings.warn(f"no {suffix} plot of study '{study.study_name}': {error}", stacklevel=2)
            for number in set(plt.get_fignums()) - before:
                plt.close(number)
            continue
        axes.figure.savefig(path, format="png", dpi=100, bbox_inches="tight")
        plt.close(axes.figure)
        written.append(path)
    return written
