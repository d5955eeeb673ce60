"""An MLP with a BatchNorm, so the EMA has buffers (one of them an integer) to handle."""

from torch import nn


class Model(nn.Module):
    """Linear -> ReLU -> BatchNorm1d -> Linear, returning ``{"logits"}``."""

    def __init__(self, in_dim=64, hidden=128, n_classes=10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.ReLU(),
            nn.BatchNorm1d(hidden),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, x):
        return {"logits": self.net(x)}
