"""Next-token cross-entropy as a composite-loss term."""

import torch.nn.functional as F
from torch import nn

from gatle_ignite import get_value


class Loss(nn.Module):
    """Cross-entropy over every predicted token, in nats: ``(B * T, V)`` logits (or ``(B, T, V)``)
    against ``(B, T)`` next tokens."""

    def __init__(self, src_name="logits", tgt_name=("targets", "next_tokens")):
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name

    def forward(self, y_pred, target, iteration=None):
        logits = get_value(y_pred, self.src_name)
        tokens = get_value(target, self.tgt_name)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
