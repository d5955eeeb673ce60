"""A sweep's Optuna study, read from the sweep's directory, drawn with Optuna's own plots.

Optuna is optional (the ``sweep`` extra) and imported only here, when a sweep is drawn.
"""

import json
import warnings
from pathlib import Path

from gatle_ignite.dispatch import ConfigError

__all__ = [
    "STUDY_FILE",
    "STUDY_PLOTS",
    "SWEEP_FILE",
    "has_study",
    "load_study",
    "write_study_plots",
]

# Where a sweep keeps its study (Optuna's journal storage) and its own description.
STUDY_FILE = "study.journal"
SWEEP_FILE = "sweep.json"
# The file suffix of each plot, and the function of optuna.visualization.matplotlib drawing it.
STUDY_PLOTS = (
    ("history", "plot_optimization_history"),
    ("importance", "plot_param_importances"),
    ("parallel", "plot_parallel_coordinate"),
)


def has_study(sweep_dir) -> bool:
    return (Path(sweep_dir) / STUDY_FILE).is_file()


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


def _study_name(sweep_dir: Path, optuna, storage) -> str:
    """The name ``sweep.json`` records; else the storage's only study."""
    try:
        recorded = json.loads((sweep_dir / SWEEP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        recorded = {}
    name = recorded.get("study_name") if isinstance(recorded, dict) else None
    if isinstance(name, str) and name:
        return name
    names = optuna.study.get_all_study_names(storage)
    if len(names) != 1:
        raise ConfigError(
            f"{sweep_dir / STUDY_FILE} holds {len(names)} studies ({', '.join(names)}) and "
            f"{sweep_dir / SWEEP_FILE} names none.\n"
            f"  Give the sweep's own directory, as `gatle-ignite sweep` made it."
        )
    return names[0]


def load_study(sweep_dir):
    """The Optuna study of the sweep in ``sweep_dir``, read from its journal file."""
    sweep_dir = Path(sweep_dir)
    optuna = require_optuna(sweep_dir)
    backend = optuna.storages.journal.JournalFileBackend(str(sweep_dir / STUDY_FILE))
    storage = optuna.storages.JournalStorage(backend)
    return optuna.load_study(study_name=_study_name(sweep_dir, optuna, storage), storage=storage)


def write_study_plots(sweep_dir, stem: str) -> list:
    """Write ``<stem>_history.png``, ``<stem>_importance.png`` and ``<stem>_parallel.png``; a
    plot Optuna cannot draw yet (too few finished trials) is skipped with a warning. Returns the
    paths written."""
    optuna = require_optuna(sweep_dir)
    study = load_study(sweep_dir)
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
