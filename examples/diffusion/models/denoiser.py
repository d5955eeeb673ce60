"""An MLP noise predictor conditioned on the diffusion step."""

import math

import torch
from torch import nn


def timestep_embedding(t, dim, max_period=10000.0):
    """Sinusoidal features of the integer steps ``t``, as in the transformer's positions."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=1)


class ResidualBlock(nn.Module):
    """``h + MLP(h + time)``: the step conditions every block."""

    def __init__(self, hidden):
        super().__init__()
        self.net = nn.Sequential(
            nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden)
        )

    def forward(self, h, time):
        return h + self.net(h + time)


class Model(nn.Module):
    """``forward(x_t, t)`` returns ``{"noise_pred"}``, the noise that took ``x0`` to ``x_t``."""

    def __init__(self, dim=2, hidden=256, time_dim=64, n_layers=3):
        super().__init__()
        self.time_dim = time_dim
        self.time_mlp = nn.Sequential(
            nn.Linear(time_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden)
        )
        self.inp = nn.Linear(dim, hidden)
        self.blocks = nn.ModuleList(ResidualBlock(hidden) for _ in range(n_layers))
        self.out = nn.Sequential(nn.SiLU(), nn.Linear(hidden, dim))

    def forward(self, x_t, t):
        time = self.time_mlp(timestep_embedding(t, self.time_dim))
        h = self.inp(x_t)
        for block in self.blocks:
            h = block(h, time)
        return {"noise_pred": self.out(h)}
