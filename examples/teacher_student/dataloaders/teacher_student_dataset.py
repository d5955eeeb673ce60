"""Gaussian vectors labelled by a fixed random one-hidden-layer network shared by every split."""

import math

import torch
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader

LABEL_HIDDEN = 128


def get_ds(ds_params, transform=None):
    """Build one split, labelled by ``argmax(tanh(x W1 / sqrt(d)) W2)``; no transform is used."""
    n = ds_params.get("n", 1024)
    in_dim = ds_params.get("in_dim", 32)
    n_classes = ds_params.get("n_classes", 8)

    # The labelling weights have their own generator, so every split (each with its own input
    # seed) is labelled by the same function.
    task_gen = torch.Generator().manual_seed(ds_params.get("task_seed", 1234))
    w1 = torch.randn(in_dim, LABEL_HIDDEN, generator=task_gen)
    w2 = torch.randn(LABEL_HIDDEN, n_classes, generator=task_gen)

    gen = torch.Generator().manual_seed(ds_params.get("seed", 0))
    x = torch.randn(n, in_dim, generator=gen)
    y = (torch.tanh(x @ w1 / math.sqrt(in_dim)) @ w2).argmax(dim=1)

    ds = TensorDataset(x, y)
    return build_dataloader(ds, ds_params), {"length": len(ds)}
