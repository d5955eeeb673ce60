"""A strided convolution and a global average pool over images, for the export tests: its
exported program keeps a guard that the pooled map is not 1 wide, so it refuses narrow images
that the eager model takes."""

from torch import nn


class Model(nn.Module):
    def __init__(self, n_classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, stride=4, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4, n_classes)

    def forward(self, pixel_values):
        return {"logits": self.head(self.pool(self.conv(pixel_values)).flatten(1))}
