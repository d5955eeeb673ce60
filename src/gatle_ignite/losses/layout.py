"""Where a model's class scores keep their classes, read from the shapes: one rule for the
built-in losses and metrics.

Scores with one dimension more than the class-index targets hold one score per class. When the
scores' shape without its last dimension is the targets' shape, the classes are LAST:
``(B, T, V)`` logits against ``(B, T)`` targets, as sequence models give them, and ``(B, C)``
against ``(B,)``. Otherwise they are in dimension 1, torch's own layout: ``(B, C, H, W)``
against ``(B, H, W)``. A shape that fits both (``(B, N, N)`` against ``(B, N)``) is read
classes last.
"""

from typing import Optional

import torch

from gatle_ignite.dispatch import ConfigError

__all__ = [
    "check_classes",
    "class_dim",
    "misread_classes",
    "not_class_indices",
    "per_position",
    "same_shape",
    "shape_mismatch",
]

_RULE = (
    "The classes are read last when the scores' shape without its last dimension is the "
    "targets' ((B, T, V) against (B, T)), else in dimension 1 ((B, C, H, W) against (B, H, W))"
)


def class_dim(scores: torch.Tensor, target: torch.Tensor) -> Optional[int]:
    """-1 when ``scores`` hold the classes last, 1 when in torch's dimension 1, None when they
    hold no score per class for these targets."""
    if scores.dim() != target.dim() + 1:
        return None
    if scores.shape[:-1] == target.shape:
        return -1
    if scores.shape[:1] + scores.shape[2:] == target.shape:
        return 1
    return None


def per_position(scores: torch.Tensor, target: torch.Tensor) -> tuple:
    """``(N, C)`` scores and ``(N,)`` targets: one row per scored position, in either layout;
    None when the shapes hold no class scores for these targets."""
    dim = class_dim(scores, target)
    if dim is None:
        return None
    if dim == 1:
        scores = scores.movedim(1, -1)
    return scores.reshape(-1, scores.shape[-1]), target.reshape(-1)


def same_shape(pred: torch.Tensor, target: torch.Tensor, what: str) -> tuple:
    """``pred`` and ``target`` of one shape, the target as ``pred``'s dtype; a last dimension of
    1 on ``pred`` alone (a regression head's ``(B, 1)`` against ``(B,)``) is dropped."""
    if pred.dim() == target.dim() + 1 and pred.shape[-1] == 1:
        pred = pred.squeeze(-1)
    if pred.shape != target.shape:
        raise ConfigError(
            f"{what}: the prediction has shape {list(pred.shape)} and the target "
            f"{list(target.shape)}; they must be the same (broadcasting them would compare "
            f"every prediction with every target).\n"
            f"  Check src_name and tgt_name, or reshape the model's output."
        )
    return pred, target.to(pred.dtype)


def shape_mismatch(what: str, scores: torch.Tensor, target: torch.Tensor) -> ConfigError:
    """The error for class scores and targets whose shapes fit neither layout."""
    return ConfigError(
        f"{what}: the scores have shape {list(scores.shape)} and the targets "
        f"{list(target.shape)}. Class scores need one dimension more than the class-index "
        f"targets, the classes last ((B, T, V) against (B, T)) or in dimension 1 "
        f"((B, C, H, W) against (B, H, W)).\n"
        f"  Check src_name and tgt_name."
    )


def misread_classes(
    what: str, scores: torch.Tensor, target: torch.Tensor, found: str
) -> ConfigError:
    """The error for class indices beyond the classes the layout rule read (``found`` says
    which): the shapes, the dimension read, and the targets' shape the other layout needs."""
    dim = class_dim(scores, target)
    if dim == 1:
        where, other, other_where, other_classes = (
            "in dimension 1",
            scores.shape[:-1],
            "last",
            scores.shape[-1],
        )
    else:
        where, other, other_where, other_classes = (
            "last",
            scores.shape[:1] + scores.shape[2:],
            "in dimension 1",
            scores.shape[1],
        )
    return ConfigError(
        f"{what}: the scores have shape {list(scores.shape)} and the targets "
        f"{list(target.shape)}, so the {scores.shape[dim]} classes are read {where}; {found}.\n"
        f"  {_RULE}: targets of shape {list(other)} would read the {other_classes} classes "
        f"{other_where}. Check src_name and tgt_name."
    )


def check_classes(
    what: str, scores: torch.Tensor, target: torch.Tensor, ignore_index: Optional[int] = None
) -> None:
    """Refuse a class index beyond the classes the layout rule reads (a negative one is
    padding to ignore). It reads the targets' values: call it once, not on every step."""
    dim = class_dim(scores, target)
    if dim is None or not target.numel():
        return
    kept = target if ignore_index is None else target[target != ignore_index]
    largest = int(kept.max()) if kept.numel() else -1
    if largest >= scores.shape[dim]:
        raise misread_classes(what, scores, target, f"the targets hold class {largest}")


def not_class_indices(what: str, scores: torch.Tensor, target: torch.Tensor) -> ConfigError:
    """The error for floating-point targets that are not the scores' shape."""
    dtype = str(target.dtype).replace("torch.", "")
    return ConfigError(
        f"{what}: the scores have shape {list(scores.shape)} and the targets are {dtype} of "
        f"shape {list(target.shape)}; class indices must be integers, and class probabilities "
        f"must have the scores' shape.\n"
        f"  Return integer class indices from prep_batch (y.long()), or check src_name and "
        f"tgt_name."
    )
