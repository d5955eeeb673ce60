"""A tiny MLP for the framework's own tests; ``batchnorm=True`` normalises its input first."""

from torch import nn


class Model(nn.Module):
    def __init__(self, in_dim=8, hidden=16, n_classes=3, dropout=0.0, batchnorm=False):
        super().__init__()
        if batchnorm:
            self.norm = nn.BatchNorm1d(in_dim)
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, n_classes)
        )

    def forward(self, x):
        if hasattr(self, "norm"):
            x = self.norm(x)
        return {"logits": self.net(x)}
