"""Precision over the split: averaged over the classes (macro, by default), per class, or of the
positive class of a binary task."""

from typing import Any, Optional, Union

from ignite.metrics import Metric, Precision

from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.averaged import precision_or_recall

__all__ = ["KWARGS_GO_TO", "get_metric"]

# Where get_metric's **kwargs go: is_multilabel, device.
KWARGS_GO_TO = ((Precision, ("output_transform", "average")),)


def get_metric(
    engine_type: str,
    info: dict,
    src_name: Name = "logits",
    tgt_name: Name = ("targets", "labels"),
    average: Union[str, bool] = "macro",
    ignore_index: Optional[int] = None,
    threshold: float = 0.0,
    **kwargs: Any,
) -> Metric:
    """ignite's ``Precision`` of ``y_pred[src_name]`` against ``target[tgt_name]``.

    ``average``: ``"macro"``, ``"micro"`` or ``"weighted"`` over the classes (one score
    per target counts two classes, 0 and 1), False for one value per class, or ``"binary"``
    for the positive class of one score per target (positive above ``threshold``).
    """
    return precision_or_recall(
        Precision, src_name, tgt_name, average, ignore_index, threshold, **kwargs
    )
