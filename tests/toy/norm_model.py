"""The toy MLP with BatchNorm and dropout: a forward changes running statistics and draws
random numbers, so a step that must leave the run unchanged is tested by it."""

from torch import nn


class Model(nn.Module):
    def __init__(self, in_dim=8, hidden=16, n_classes=3, dropout=0.3):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, x):
        return {"logits": self.net(x)}
