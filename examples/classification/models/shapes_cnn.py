"""A small CNN for the 1x32x32 shapes images."""

from torch import nn


def _block(in_ch, out_ch):
    # No conv bias: the BatchNorm after it has its own shift.
    return [
        nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    ]


class Model(nn.Module):
    """Three Conv-BN-ReLU-MaxPool blocks (32 -> 16 -> 8 -> 4), global pooling, a linear head."""

    def __init__(self, n_classes=5, width=16, dropout=0.1, in_ch=1):
        super().__init__()
        self.features = nn.Sequential(
            *_block(in_ch, width), *_block(width, 2 * width), *_block(2 * width, 4 * width)
        )
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(4 * width, n_classes),
        )

    def forward(self, image):
        return {"logits": self.head(self.features(image))}
