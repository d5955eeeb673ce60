"""A two-layer perceptron returning a dict of outputs."""

from torch import nn


class Model(nn.Module):
    """Linear -> ReLU -> Linear; no ``**kwargs``, so a misspelt ``model_params`` key fails."""

    def __init__(self, in_dim=64, hidden=128, n_classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, x):
        return {"logits": self.net(x)}
