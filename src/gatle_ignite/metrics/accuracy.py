"""Accuracy: the share of targets predicted right, over the split."""

from typing import Any, Optional

from ignite.metrics import Accuracy, Metric

from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.transforms import classified

__all__ = ["KWARGS_GO_TO", "get_metric"]

# Where get_metric's **kwargs go: is_multilabel, device.
KWARGS_GO_TO = ((Accuracy, ("output_transform",)),)


def get_metric(
    engine_type: str,
    info: dict,
    src_name: Name = "logits",
    tgt_name: Name = ("targets", "labels"),
    ignore_index: Optional[int] = None,
    threshold: float = 0.0,
    **kwargs: Any,
) -> Metric:
    """ignite's ``Accuracy`` of the argmax of ``y_pred[src_name]`` against
    ``target[tgt_name]``; one score per target counts as positive above ``threshold``.

    ``ignore_index`` (e.g. -100, as the loss's) leaves those target positions out.
    """
    transform = classified(src_name, tgt_name, ignore_index, threshold, what="accuracy")
    return Accuracy(output_transform=transform, **kwargs)
