"""Train-time augmentation for the shapes images: flip, shift, brightness and noise."""

import torch


class Transformation:
    """Random horizontal flip, roll by up to ``max_shift`` px, brightness scaling, added noise.

    ``calls`` counts the images it has transformed, so a check can see which splits use it.
    """

    def __init__(self, p_flip=0.5, noise=0.05, max_shift=2, brightness=0.2):
        self.p_flip = p_flip
        self.noise = noise
        self.max_shift = max_shift
        self.brightness = brightness
        self.calls = 0

    def __call__(self, image):
        self.calls += 1
        if float(torch.rand(())) < self.p_flip:
            image = image.flip(-1)
        shifts = torch.randint(-self.max_shift, self.max_shift + 1, (2,)).tolist()
        image = image.roll(shifts, dims=(-2, -1))
        scale = 1.0 + self.brightness * (2 * float(torch.rand(())) - 1)
        return image * scale + self.noise * torch.randn_like(image)
