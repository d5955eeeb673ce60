"""NT-Xent (SimCLR): each view must pick its partner out of the other 2B - 2 samples."""

import torch
from torch import nn
from torch.nn import functional as F

from gatle_ignite import get_value


class Loss(nn.Module):
    """Contrastive loss over ``y_pred[src_a]`` and ``y_pred[src_b]``, both L2-normalised.

    There is no ``tgt_name``: the targets are batch positions, row i's partner is row i + B.
    """

    def __init__(self, src_a="z1", src_b="z2", temperature=0.2):
        super().__init__()
        self.src_a = src_a
        self.src_b = src_b
        self.temperature = temperature

    def forward(self, y_pred, target, iteration=None):
        z = torch.cat([get_value(y_pred, self.src_a), get_value(y_pred, self.src_b)])
        batch = z.shape[0] // 2
        if batch < 2:
            raise ValueError(
                f"NT-Xent needs at least 2 samples per batch, got {batch}: with one there is no "
                "negative to contrast against."
            )
        sim = z @ z.T / self.temperature
        # A sample always matches itself best; -inf takes it out of the softmax.
        self_mask = torch.eye(2 * batch, dtype=torch.bool, device=z.device)
        sim = sim.masked_fill(self_mask, float("-inf"))
        index = torch.arange(batch, device=z.device)
        partners = torch.cat([index + batch, index])
        return F.cross_entropy(sim, partners)
