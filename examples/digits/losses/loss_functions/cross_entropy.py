"""Cross-entropy as one term of the composite loss."""

from torch import nn

from gatle_ignite import get_value


class Loss(nn.Module):
    """``nn.CrossEntropyLoss(**kwargs)`` (``label_smoothing`` among them) on logits vs labels."""

    def __init__(self, src_name="logits", tgt_name=("targets", "labels"), **kwargs):
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name
        self.ce = nn.CrossEntropyLoss(**kwargs)

    def forward(self, y_pred, target, iteration=None):
        logits = get_value(y_pred, self.src_name)
        return self.ce(logits, get_value(target, self.tgt_name))
