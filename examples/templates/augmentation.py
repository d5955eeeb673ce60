"""Template for ``aug_name``: ``Transformation(**aug_params)``, any callable."""

import torch


class Transformation:
    """With probability ``p``, add Gaussian noise scaled by ``scale``.

    One instance is handed to every split; the dataset decides where to apply it.
    """

    def __init__(self, p=0.5, scale=0.1):
        self.p = p
        self.scale = scale

    def __call__(self, x):
        if torch.rand(()) >= self.p:
            return x
        return x + torch.randn_like(x) * self.scale
