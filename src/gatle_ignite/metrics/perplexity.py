"""Perplexity: exp of the mean token cross-entropy over the split.

The sum of the tokens' cross-entropy and their count are kept apart and all-reduced once, so
the value is the split's token mean on any number of ranks, whatever each batch holds; targets
equal to ``ignore_index`` (padding) count in neither.
"""

import math
from typing import Callable, Union

import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce
from torch.nn import functional as F

from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.transforms import CLASS_SCORES, classified

__all__ = ["Perplexity", "get_metric"]


class Perplexity(Metric):
    """``exp(sum of token cross-entropy / token count)``, both summed over every rank."""

    _state_dict_all_req_keys = ("_sum", "_count")

    def __init__(
        self,
        output_transform: Callable,
        ignore_index: int = -100,
        device: Union[str, torch.device] = "cpu",
    ) -> None:
        self.ignore_index = ignore_index
        super().__init__(output_transform=output_transform, device=device)

    @reinit__is_reduced
    def reset(self) -> None:
        self._sum = torch.tensor(0.0, dtype=torch.float64, device=self._device)
        self._count = torch.tensor(0, dtype=torch.int64, device=self._device)

    @reinit__is_reduced
    def update(self, output: tuple) -> None:
        scores, target = output
        # In float32 at least: a bf16 log-softmax over a vocabulary loses the digits that count.
        summed = F.cross_entropy(
            scores.float(), target, ignore_index=self.ignore_index, reduction="sum"
        )
        self._sum += summed.to(self._device, torch.float64)
        self._count += (target != self.ignore_index).sum().to(self._device)

    @sync_all_reduce("_sum", "_count")
    def compute(self) -> float:
        if self._count.item() == 0:
            raise NotComputableError(
                "perplexity needs at least one target that is not ignore_index."
            )
        return math.exp(min(self._sum.item() / self._count.item(), _LARGEST_EXPONENT))


# exp() of more overflows a float; the perplexity of a model that bad is shown as about 1e308.
_LARGEST_EXPONENT = 709.0


def get_metric(
    engine_type: str,
    info: dict,
    src_name: Name = "logits",
    tgt_name: Name = ("targets", "labels"),
    ignore_index: int = -100,
    device: Union[str, torch.device] = "cpu",
) -> Metric:
    """Perplexity of the class scores ``y_pred[src_name]`` (``(B, T, V)`` logits, classes last)
    against the token indices ``target[tgt_name]`` (``(B, T)``)."""
    transform = classified(src_name, tgt_name, kind=CLASS_SCORES, what="perplexity")
    return Perplexity(transform, ignore_index=ignore_index, device=device)
