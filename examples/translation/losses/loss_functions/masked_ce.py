"""Token-level cross-entropy that ignores padding."""

import torch.nn.functional as F
from torch import nn

from examples.translation.dataloaders.data_utils.vocab import PAD_ID
from gatle_ignite import get_value


class Loss(nn.Module):
    """Cross-entropy over every (row, position) of ``(B, U, V)`` logits, skipping PAD targets.

    Without the mask, short rows would be trained to predict PAD after their EOS, and the loss
    would be averaged over positions that carry no translation.
    """

    def __init__(
        self,
        src_name="logits",
        tgt_name=("targets", "tgt_out"),
        ignore_index=PAD_ID,
        label_smoothing=0.0,
    ):
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, y_pred, target, iteration=None):
        logits = get_value(y_pred, self.src_name)
        tokens = get_value(target, self.tgt_name)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            tokens.reshape(-1),
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
        )
