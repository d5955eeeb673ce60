"""A tiny MLP for the framework's own tests."""

from torch import nn


class Model(nn.Module):
    def __init__(self, in_dim=8, hidden=16, n_classes=3, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, n_classes)
        )

    def forward(self, x):
        return {"logits": self.net(x)}
