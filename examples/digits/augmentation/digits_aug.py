"""A random affine (rotation and shift) for 1x8x8 digit images, in plain torch."""

import math

import torch
import torch.nn.functional as F


class Transformation:
    """Rotate within +-``degrees`` and shift within +-``translate`` of the image size.

    ``calls`` counts the images transformed in this process (a DataLoader worker counts its own).
    """

    def __init__(self, degrees=10, translate=0.1):
        self.degrees = degrees
        self.translate = translate
        self.calls = 0

    def __call__(self, image):
        self.calls += 1
        angle = math.radians(self.degrees) * (2 * float(torch.rand(())) - 1)
        # affine_grid works in [-1, 1] coordinates, where the full width spans 2.
        shift = 2 * self.translate * (2 * torch.rand(2) - 1)
        cos, sin = math.cos(angle), math.sin(angle)
        theta = torch.tensor([[cos, -sin, float(shift[0])], [sin, cos, float(shift[1])]])
        grid = F.affine_grid(theta.unsqueeze(0), [1, *image.shape], align_corners=False)
        return F.grid_sample(image.unsqueeze(0), grid, align_corners=False).squeeze(0)
