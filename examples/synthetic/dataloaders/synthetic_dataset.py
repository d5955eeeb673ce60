"""Gaussian vectors labelled by ``argmax(x @ W)``, with ``W`` shared by every split."""

import torch
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader


def get_ds(ds_params, transform=None):
    """Build one split; ``transform`` is not used by this task."""
    n = ds_params.get("n", 1024)
    in_dim = ds_params.get("in_dim", 64)
    n_classes = ds_params.get("n_classes", 10)

    # W has its own generator: drawing it from the inputs' generator would give every split
    # (each with its own seed) a different labelling function.
    task_gen = torch.Generator().manual_seed(ds_params.get("task_seed", 1234))
    weights = torch.randn(in_dim, n_classes, generator=task_gen)

    gen = torch.Generator().manual_seed(ds_params.get("seed", 0))
    x = torch.randn(n, in_dim, generator=gen)
    y = (x @ weights).argmax(dim=1)

    ds = TensorDataset(x, y)
    return build_dataloader(ds, ds_params), {"length": len(ds)}
