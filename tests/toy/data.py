"""A seeded, learnable toy dataset: label = argmax(x @ W)."""

import torch
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader


def make_dataset(n=64, in_dim=8, n_classes=3, seed=0, task_seed=1234):
    weights = torch.randn(in_dim, n_classes, generator=torch.Generator().manual_seed(task_seed))
    x = torch.randn(n, in_dim, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, (x @ weights).argmax(dim=1))


def get_ds(ds_params, transform=None):
    dataset = make_dataset(
        n=ds_params.get("n", 64),
        in_dim=ds_params.get("in_dim", 8),
        n_classes=ds_params.get("n_classes", 3),
        seed=ds_params.get("seed", 0),
    )
    return build_dataloader(dataset, ds_params), {"length": len(dataset), "num_classes": 3}
