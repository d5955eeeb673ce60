"""F1 over the split: the harmonic mean of precision and recall, averaged over the classes
(macro, by default), per class, or of the positive class of a binary task."""

from typing import Union

import torch
from ignite.metrics import Fbeta

from gatle_ignite.metrics.averaged import Precision, Recall, averaged_metric

__all__ = ["KWARGS_GO_TO", "get_metric"]

# Where get_metric's **kwargs go: device.
KWARGS_GO_TO = ((Fbeta, ("beta", "average", "precision", "recall", "output_transform")),)


def _f1(transform, average: Union[str, bool], device: Union[str, torch.device] = "cpu") -> Fbeta:
    """ignite's ``Fbeta`` with beta 1 of ``y_pred[src_name]`` against ``target[tgt_name]``."""
    precision = Precision(output_transform=transform, average=False, device=device)
    recall = Recall(output_transform=transform, average=False, device=device)
    # Binary: the mean of the one positive-class value, a number rather than a tensor.
    return Fbeta(1.0, average=average is not False, precision=precision, recall=recall)


get_metric = averaged_metric(_f1, ("macro", False, "binary"), "f1", __name__)
