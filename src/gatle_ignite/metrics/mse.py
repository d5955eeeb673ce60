"""Mean squared error over the split: over every element of every prediction, any shape."""

from typing import Any

from ignite.metrics import MeanSquaredError, Metric

from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.transforms import regressed

__all__ = ["KWARGS_GO_TO", "get_metric"]

# Where get_metric's **kwargs go: device.
KWARGS_GO_TO = ((MeanSquaredError, ("output_transform",)),)


def get_metric(
    engine_type: str,
    info: dict,
    src_name: Name = "logits",
    tgt_name: Name = ("targets", "labels"),
    **kwargs: Any,
) -> Metric:
    """ignite's ``MeanSquaredError`` of ``y_pred[src_name]`` against a ``target[tgt_name]`` of
    its shape (a ``(B, 1)`` prediction against ``(B,)`` targets is compared as ``(B,)``)."""
    transform = regressed(src_name, tgt_name, what="mse")
    return MeanSquaredError(output_transform=transform, **kwargs)
