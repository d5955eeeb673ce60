"""F1 over the split: the harmonic mean of precision and recall, per class, averaged over the
classes (macro, by default) or of the positive class of a binary task."""

from typing import Optional, Union

import torch
from ignite.metrics import Fbeta, Metric, Precision, Recall

from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.averaged import check_average
from gatle_ignite.metrics.transforms import DECISIONS, TWO_CLASSES, classified

__all__ = ["get_metric"]

_AVERAGES = ("macro", False, "binary")


def get_metric(
    engine_type: str,
    info: dict,
    src_name: Name = "logits",
    tgt_name: Name = ("targets", "labels"),
    average: Union[str, bool] = "macro",
    ignore_index: Optional[int] = None,
    threshold: float = 0.0,
    device: Union[str, torch.device] = "cpu",
) -> Metric:
    """ignite's ``Fbeta`` with beta 1 of ``y_pred[src_name]`` against ``target[tgt_name]``.

    ``average``: ``"macro"``, the mean of the classes' F1 (one score per target counts two
    classes, 0 and 1); False, one value per class; ``"binary"``, the positive class of one
    score per target (positive above ``threshold``).
    """
    check_average(average, _AVERAGES, "f1")
    binary = average == "binary"
    kind = DECISIONS if binary else TWO_CLASSES
    transform = classified(src_name, tgt_name, ignore_index, threshold, kind=kind, what="f1")
    precision = Precision(output_transform=transform, average=False, device=device)
    recall = Recall(output_transform=transform, average=False, device=device)
    # Binary: the mean of the one positive-class value, a number rather than a tensor.
    return Fbeta(1.0, average=average is not False, precision=precision, recall=recall)
