"""A best checkpoint's score as the metric's own value, and its direction in words.

A best file is named after ``score_factor x metric`` (0.4's names, kept), so a lower-is-better
metric reads negative there. What ``status``, ``runs``, the summary, the sweep and ``plot``
show is the metric's value and, for a negative factor, "lower is better".
"""

from collections.abc import Mapping
from typing import Optional

__all__ = ["LOWER_IS_BETTER", "direction", "metric_value", "score_fields", "scoring"]

LOWER_IS_BETTER = "lower is better"

# The engines of EVAL_SPECS name their score fields their own way; a declared engine by its
# name (EngineSpec.for_split).
_FIELDS = {
    "valid": ("score_name", "score_factor"),
    "test": ("tester_score_name", "tester_score_factor"),
}


def score_fields(engine: Optional[str]) -> tuple:
    """``(score name field, score factor field)`` of the engine that writes ``<engine>_best``
    files; a 0.4 file name carries no engine, and was the evaluator's."""
    if not engine:
        return _FIELDS["valid"]
    return _FIELDS.get(engine, (f"{engine}_score_name", f"{engine}_score_factor"))


def scoring(config: Mapping, engine: Optional[str]) -> tuple:
    """``(score name or None, factor)`` that ``config`` gives ``engine``'s best checkpoints;
    a name that is no text, or a factor that is no non-zero number (a run.json someone else
    wrote), counts as unset."""
    name_field, factor_field = score_fields(engine)
    name, factor = config.get(name_field, None), config.get(factor_field, None)
    number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
    return (name if isinstance(name, str) else None), (factor if number and factor else 1)


def metric_value(score: Optional[float], factor) -> Optional[float]:
    """The metric's value behind ``score`` (``factor x value``)."""
    return None if score is None else score / (factor or 1)


def direction(factor) -> str:
    """``" (lower is better)"`` for a negative factor, else nothing."""
    return f" ({LOWER_IS_BETTER})" if (factor or 1) < 0 else ""
