"""scikit-learn's bundled 8x8 digits, scaled up to ``size`` pixels: 1437 train, 360 valid."""

import torch
from sklearn.datasets import load_digits
from torch.nn.functional import interpolate
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader


def get_ds(ds_params, transform=None):
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    keep = order[:1437] if ds_params["split"] == "train" else order[1437:]
    images = interpolate(images[keep], size=ds_params["size"], mode="bilinear")
    dataset = TensorDataset(images, torch.tensor(digits.target)[keep])
    return build_dataloader(dataset, ds_params), {"length": len(dataset)}
