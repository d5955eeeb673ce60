"""Precision and recall over the split, per class or averaged over the classes."""

from typing import Any, Optional, Union

from ignite.metrics import Precision, Recall

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.transforms import DECISIONS, TWO_CLASSES, classified

__all__ = ["AVERAGES", "check_average", "precision_or_recall"]

# "binary": the positive class of one score per target. False: one value per class. The others
# are ignite's averages over the classes; one score per target counts two classes, 0 and 1.
AVERAGES = ("macro", "micro", "weighted", False, "binary")


def check_average(average: Union[str, bool], allowed: tuple, what: str) -> None:
    if average not in allowed:
        raise ConfigError(
            f"{what}: average={average!r} is not one of {', '.join(map(repr, allowed))}.\n"
            f"  Set it in the metric's params."
        )


def precision_or_recall(
    metric: type,
    src_name: Name,
    tgt_name: Name,
    average: Union[str, bool],
    ignore_index: Optional[int],
    threshold: float,
    **kwargs: Any,
) -> Union[Precision, Recall]:
    """``metric`` (ignite's ``Precision`` or ``Recall``) read as the built-ins read a step."""
    what = metric.__name__.lower()
    check_average(average, AVERAGES, what)
    binary = average == "binary"
    kind = DECISIONS if binary else TWO_CLASSES
    transform = classified(src_name, tgt_name, ignore_index, threshold, kind=kind, what=what)
    return metric(output_transform=transform, average=False if binary else average, **kwargs)
