"""A two-block CNN for 1x8x8 digits."""

from torch import nn


def _block(in_ch, out_ch):
    return [
        nn.Conv2d(in_ch, out_ch, 3, padding=1),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    ]


class Model(nn.Module):
    """Two Conv-BN-ReLU-MaxPool blocks (8 -> 4 -> 2), then Flatten, Dropout and a linear head."""

    def __init__(self, n_classes=10, width=32, dropout=0.25):
        super().__init__()
        self.features = nn.Sequential(*_block(1, width), *_block(width, 2 * width))
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(2 * width * 2 * 2, n_classes)
        )

    def forward(self, image):
        return {"logits": self.head(self.features(image))}
