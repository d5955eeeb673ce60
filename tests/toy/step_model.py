"""Per-step class scores for the layout tests: ``(B, steps, n_classes)`` logits from ``x``."""

from torch import nn


class Model(nn.Module):
    def __init__(self, in_dim=8, steps=5, n_classes=10):
        super().__init__()
        self.steps, self.n_classes = steps, n_classes
        self.head = nn.Linear(in_dim, steps * n_classes)

    def forward(self, x):
        return {"logits": self.head(x).view(len(x), self.steps, self.n_classes)}
