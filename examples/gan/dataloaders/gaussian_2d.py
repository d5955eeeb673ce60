"""Samples of a correlated 2-D Gaussian: the distribution the generator must learn."""

import torch
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader

MEAN = torch.tensor([2.0, -1.0])
# Cholesky factor of the covariance: x = randn @ COV_L.T + MEAN.
COV_L = torch.tensor([[1.2, 0.0], [1.0, 0.35]])


def sample_real(n, seed):
    """``n`` real points from their own generator; the verifier draws its floor with it too."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, generator=gen) @ COV_L.T + MEAN


def get_ds(ds_params, transform=None):
    """One split of real points; ``transform`` is not used by this task."""
    real = sample_real(ds_params.get("n", 4096), ds_params.get("seed", 0))
    ds = TensorDataset(real)
    return build_dataloader(ds, ds_params), {"length": len(ds), "data_dim": real.shape[1]}
