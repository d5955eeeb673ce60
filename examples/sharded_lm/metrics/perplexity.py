"""Perplexity: ``exp`` of the mean next-token cross-entropy over every token of the split."""

import math

import torch
import torch.nn.functional as F
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from gatle_ignite import get_value


class Perplexity(Metric):
    """Sums the loss and the token count, so every rank's shard of the split counts once.

    A mean of per-batch perplexities would weigh the exponent of each batch instead.
    """

    @reinit__is_reduced
    def reset(self):
        self._nll = torch.tensor(0.0, dtype=torch.float64, device=self._device)
        self._tokens = torch.tensor(0, dtype=torch.long, device=self._device)

    @reinit__is_reduced
    def update(self, output):
        logits, tokens = output
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), tokens.reshape(-1), reduction="sum"
        )
        self._nll += nll.detach().to(self._device, torch.float64)
        self._tokens += tokens.numel()

    @sync_all_reduce("_nll", "_tokens")
    def compute(self):
        if self._tokens.item() == 0:
            raise NotComputableError("Perplexity needs at least one token before compute()")
        return math.exp(self._nll.item() / self._tokens.item())


def get_metric(engine_type, info, src_name="logits", tgt_name=("targets", "next_tokens"), **kwargs):
    """A ``Perplexity`` of ``y_pred[src_name]`` against ``target[tgt_name]``."""

    def output_transform(output):
        return get_value(output["y_pred"], src_name), get_value(output["target"], tgt_name)

    return Perplexity(output_transform=output_transform, **kwargs)
