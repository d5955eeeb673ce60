"""The output transforms of the built-in metrics: what an ignite metric is given of a step.

Class scores follow the losses' layout rule (:mod:`gatle_ignite.losses.layout`): every scored
position becomes a row, so ``(B, T, V)`` logits against ``(B, T)`` targets are ``B * T``
predictions. A prediction of the target's own shape (or with a last dimension of 1) is one score
per target: positive when above ``threshold`` (0.0 suits logits, 0.5 probabilities).
"""

from typing import Callable, Optional

import torch
from torch.nn.functional import one_hot

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.losses.layout import per_position, same_shape, shape_mismatch
from gatle_ignite.losses.reading import Name, read_prediction, read_target

__all__ = [
    "ANY",
    "CLASS_SCORES",
    "DECISIONS",
    "TWO_CLASSES",
    "classified",
    "regressed",
    "sides",
]


def sides(output: dict, src_name: Name, tgt_name: Name) -> tuple:
    """``(prediction, target)`` of a step's output, the prediction detached."""
    prediction = read_prediction(output["y_pred"], src_name)
    return prediction.detach(), read_target(output["target"], tgt_name)


def _one_score_each(scores: torch.Tensor, target: torch.Tensor) -> bool:
    if scores.shape == target.shape:
        return True
    return scores.dim() == target.dim() + 1 and scores.shape[-1] == 1


def _kept(scores: torch.Tensor, target: torch.Tensor, ignore_index: Optional[int]) -> tuple:
    if ignore_index is None:
        return scores, target
    keep = target != ignore_index
    return scores[keep], target[keep]


# What a metric takes of class predictions (``classified``'s ``kind``).
ANY, TWO_CLASSES, DECISIONS, CLASS_SCORES = "any", "two classes", "decisions", "class scores"


def classified(
    src_name: Name,
    tgt_name: Name,
    ignore_index: Optional[int] = None,
    threshold: float = 0.0,
    kind: str = ANY,
    what: str = "metric",
) -> Callable[[dict], tuple]:
    """``(predictions, targets)`` for ignite's classification metrics, targets equal to
    ``ignore_index`` left out.

    Class scores become ``(N, C)`` scores against ``(N,)`` indices. One score per target
    becomes 0/1 decisions (``(N,)``, or ``(N, L)`` for several labels); with ``kind``
    ``TWO_CLASSES`` the scores of two classes, 0 and 1, so that averages over classes count
    both. ``DECISIONS`` and ``CLASS_SCORES`` refuse the other form.
    """

    def transform(output: dict) -> tuple:
        scores, target = sides(output, src_name, tgt_name)
        if _one_score_each(scores, target):
            if kind == CLASS_SCORES:
                raise _refused(what, "a score per class", scores, target)
            decisions = (scores.reshape(target.shape) > threshold).long()
            decisions, target = _kept(decisions, target.long(), ignore_index)
            if kind == TWO_CLASSES:
                return one_hot(decisions.reshape(-1), 2), target.reshape(-1)
            return decisions, target
        if kind == DECISIONS:
            raise _refused(what, "one score per target", scores, target)
        rows = per_position(scores, target)
        if rows is None:
            raise shape_mismatch(f"{what} of {src_name!r}", scores, target)
        return _kept(rows[0], rows[1].long(), ignore_index)

    return transform


def _refused(what: str, needed: str, scores: torch.Tensor, target: torch.Tensor) -> ConfigError:
    return ConfigError(
        f"{what} needs {needed}, but the scores have shape {list(scores.shape)} against "
        f"targets of shape {list(target.shape)}.\n"
        f"  Check src_name and tgt_name, or the metric's params."
    )


def regressed(src_name: Name, tgt_name: Name, what: str = "metric") -> Callable[[dict], tuple]:
    """``(predictions, targets)`` as two flat float tensors of one length: the mean is then over
    every element, whatever the shape."""

    def transform(output: dict) -> tuple:
        prediction, target = same_shape(*sides(output, src_name, tgt_name), f"{what}")
        return prediction.reshape(-1), target.reshape(-1)

    return transform
