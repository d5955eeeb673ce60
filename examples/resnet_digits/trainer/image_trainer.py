"""The image task's trainer: the image in as transformers names it, the digit as the target.
Training images are augmented on the way: each shifted by up to an eighth of its size in both
directions (sub-pixel, bilinear), and noised."""

import torch
from torch.nn.functional import affine_grid, grid_sample

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        image, label = to_device(batch, self.device)
        if split == "train":
            shift = torch.eye(2, 3, device=image.device).repeat(len(image), 1, 1)
            shift[:, :, 2] = (torch.rand(len(image), 2, device=image.device) - 0.5) / 4
            grid = affine_grid(shift, list(image.shape), align_corners=False)
            image = grid_sample(image, grid, align_corners=False) + 0.05 * torch.randn_like(image)
        return {"model_input": {"pixel_values": image}, "targets": {"labels": label}}
