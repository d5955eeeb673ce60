"""A loss term that reads the model's output by indexing it, as a hand-written loss does."""

from torch import nn


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.ce = nn.CrossEntropyLoss()

    def forward(self, y_pred, target, iteration=None):
        return self.ce(y_pred["logits"], target["targets"]["labels"])
