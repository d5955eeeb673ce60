"""Template for ``model_name``: ``Model(**model_params)``, whose forward returns a dict."""

from torch import nn


class Model(nn.Module):
    """An MLP 64 -> 128 -> 10; the ``backbone`` / ``head`` names are what the trainer reads."""

    def __init__(self, in_dim=64, hidden=128, n_classes=10):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return {"logits": self.head(self.backbone(x))}
