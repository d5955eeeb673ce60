"""scikit-learn's bundled 8x8 digits, scaled up to ``size`` pixels; 1437 train, 360 valid. A
train image is augmented each time it is read: shifted by up to two pixels, and noised."""

import torch
from sklearn.datasets import load_digits
from torch.nn.functional import interpolate
from torch.utils.data import Dataset

from gatle_ignite import build_dataloader


class Digits(Dataset):
    def __init__(self, split, size):
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
        keep = order[:1437] if split == "train" else order[1437:]
        self.images = interpolate(images[keep], size=size, mode="bilinear")
        self.labels, self.augment = torch.tensor(digits.target)[keep], split == "train"

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index]
        if self.augment:
            shift = torch.randint(-2, 3, (2,)).tolist()
            image = image.roll(shift, dims=(1, 2)) + 0.05 * torch.randn_like(image)
        return image, self.labels[index]


def get_ds(ds_params, transform=None):
    dataset = Digits(ds_params["split"], ds_params["size"])
    return build_dataloader(dataset, ds_params), {"length": len(dataset)}
