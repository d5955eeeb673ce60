"""Top-k accuracy: the share of targets among the k highest class scores, over the split."""

from typing import Any, Optional

from ignite.metrics import Metric, TopKCategoricalAccuracy

from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.transforms import CLASS_SCORES, classified

__all__ = ["KWARGS_GO_TO", "get_metric"]

# Where get_metric's **kwargs go: device.
KWARGS_GO_TO = ((TopKCategoricalAccuracy, ("output_transform", "k")),)


def get_metric(
    engine_type: str,
    info: dict,
    src_name: Name = "logits",
    tgt_name: Name = ("targets", "labels"),
    k: int = 5,
    ignore_index: Optional[int] = None,
    **kwargs: Any,
) -> Metric:
    """ignite's ``TopKCategoricalAccuracy`` of the class scores ``y_pred[src_name]`` against
    the class indices ``target[tgt_name]``; ``ignore_index`` leaves those positions out."""
    transform = classified(
        src_name, tgt_name, ignore_index, kind=CLASS_SCORES, what="top_k_accuracy"
    )
    return TopKCategoricalAccuracy(k=k, output_transform=transform, **kwargs)
