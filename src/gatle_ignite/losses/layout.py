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

__all__ = ["class_dim", "per_position", "same_shape", "shape_mismatch"]


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
