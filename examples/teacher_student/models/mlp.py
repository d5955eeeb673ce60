"""An MLP of configurable width and depth; both the teacher and the student are one."""

from torch import nn


class Model(nn.Module):
    """``depth`` pairs of Linear + ReLU, then a final Linear; returns ``{"logits"}``."""

    def __init__(self, in_dim=64, hidden=128, depth=2, n_classes=10):
        super().__init__()
        layers = []
        width = in_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return {"logits": self.net(x)}
