"""2-D points from ``N_MODES`` Gaussians evenly spaced on a ring."""

import math

import torch
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader

N_MODES = 8


def mode_centers(n_modes=N_MODES, radius=1.0):
    """The ``(n_modes, 2)`` mode centres, evenly spaced on the ring."""
    angles = torch.arange(n_modes, dtype=torch.float32) * (2 * math.pi / n_modes)
    return radius * torch.stack([angles.cos(), angles.sin()], dim=1)


def sample_ring(n, generator, n_modes=N_MODES, radius=1.0, std=0.05):
    """``n`` points: a uniformly chosen mode centre plus isotropic Gaussian noise."""
    modes = torch.randint(n_modes, (n,), generator=generator)
    noise = std * torch.randn(n, 2, generator=generator)
    return mode_centers(n_modes, radius)[modes] + noise


def get_ds(ds_params, transform=None):
    """One split; ``info`` carries the ring's geometry for the metrics."""
    radius = ds_params.get("radius", 1.0)
    std = ds_params.get("std", 0.05)
    gen = torch.Generator().manual_seed(ds_params.get("seed", 0))
    x = sample_ring(ds_params.get("n", 4096), gen, N_MODES, radius, std)
    ds = TensorDataset(x)
    info = {
        "length": len(ds),
        "mode_centers": mode_centers(N_MODES, radius),
        "n_modes": N_MODES,
        "radius": radius,
        "std": std,
    }
    return build_dataloader(ds, ds_params), info
