"""A deep, wide MLP: about 100 M parameters at the default sizes, for checkpoint timings."""

from torch import nn


class Model(nn.Module):
    def __init__(self, in_dim=64, width=4096, depth=7, n_classes=10):
        super().__init__()
        layers = [nn.Linear(in_dim, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, n_classes))

    def forward(self, x):
        return {"logits": self.net(x)}
