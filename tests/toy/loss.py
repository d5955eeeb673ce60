"""Loss terms for the composite: cross-entropy, and one that turns NaN on demand."""

from torch import nn

from gatle_ignite import get_value


class Loss(nn.Module):
    def __init__(self, src_name="logits", tgt_name=("targets", "labels")):
        super().__init__()
        self.src_name, self.tgt_name = src_name, tgt_name
        self.ce = nn.CrossEntropyLoss()

    def forward(self, y_pred, target, iteration=None):
        return self.ce(get_value(y_pred, self.src_name), get_value(target, self.tgt_name))
