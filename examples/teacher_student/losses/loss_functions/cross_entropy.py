"""Cross-entropy against the hard labels, as a composite-loss term."""

from torch import nn

from gatle_ignite import get_value


class Loss(nn.Module):
    """``nn.CrossEntropyLoss(**kwargs)`` between ``y_pred[src_name]`` and ``target[tgt_name]``."""

    def __init__(self, src_name="logits", tgt_name=("targets", "labels"), **kwargs):
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name
        self.ce = nn.CrossEntropyLoss(**kwargs)

    def forward(self, y_pred, target, iteration=None):
        return self.ce(get_value(y_pred, self.src_name), get_value(target, self.tgt_name))
