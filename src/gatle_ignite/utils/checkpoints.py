"""0.4's import path for checkpoint names, finders and weight loading; they live in ``run``."""

from gatle_ignite.run.layout import (
    BEST_SUFFIX,
    LATEST_ITER_PREFIX,
    LATEST_PREFIX,
    _candidates,  # noqa: F401  (0.4 surface, CONTRACT 7.8)
    best_prefix_for,
    find_best_checkpoint,
    find_latest_checkpoint,
    find_resume_checkpoints,
    resolve_eval_checkpoint,
    score_of,
)
from gatle_ignite.run.loading import (
    RunMeta,
    load_checkpoint_file,
    load_weights,
    report_weight_match,
)

__all__ = [
    "BEST_SUFFIX",
    "LATEST_ITER_PREFIX",
    "LATEST_PREFIX",
    "RunMeta",
    "best_prefix_for",
    "find_best_checkpoint",
    "find_latest_checkpoint",
    "find_resume_checkpoints",
    "load_checkpoint_file",
    "load_weights",
    "report_weight_match",
    "resolve_eval_checkpoint",
    "score_of",
]
