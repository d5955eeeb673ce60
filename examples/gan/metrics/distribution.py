"""How far the generated points are from the real ones, over a whole evaluation pass."""

import ignite.distributed as idist
import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric

from gatle_ignite import get_value

STATS = ("swd", "moments")
N_PROJECTIONS = 256
N_QUANTILES = 256


def sliced_wasserstein(a, b, n_projections=N_PROJECTIONS, n_quantiles=N_QUANTILES, seed=0):
    """Mean 1-D Wasserstein distance over random directions, from matched quantiles.

    The directions come from a fixed seed, so every call (and every checkpoint) is scored on the
    same slices.
    """
    gen = torch.Generator().manual_seed(seed)
    directions = torch.randn(a.shape[1], n_projections, generator=gen, dtype=torch.float64)
    directions = directions / directions.norm(dim=0, keepdim=True)
    levels = (torch.arange(n_quantiles, dtype=torch.float64) + 0.5) / n_quantiles
    qa = torch.quantile(a.double() @ directions, levels, dim=0)
    qb = torch.quantile(b.double() @ directions, levels, dim=0)
    return float((qa - qb).abs().mean())


def moment_distance(a, b):
    """``|mean_a - mean_b| + ||cov_a - cov_b||_F``: blind to shape, but easy to read."""
    a, b = a.double(), b.double()
    mean_gap = (a.mean(dim=0) - b.mean(dim=0)).norm()
    cov_gap = (torch.cov(a.T) - torch.cov(b.T)).norm()
    return float(mean_gap + cov_gap)


def _gather(x):
    """Every rank's rows. all_gather needs equal shapes, so shards are padded, then trimmed."""
    if idist.get_world_size() == 1:
        return x
    # A one-element tensor: ignite 0.5 gathers a plain int into a list, not a tensor.
    sizes = idist.all_gather(torch.tensor([x.shape[0]], device=x.device)).tolist()
    biggest = max(sizes)
    padded = torch.cat([x, x.new_zeros(biggest - x.shape[0], *x.shape[1:])])
    chunks = idist.all_gather(padded).split(biggest)
    return torch.cat([chunk[:n] for chunk, n in zip(chunks, sizes)])


class DistributionDistance(Metric):
    """``swd`` or ``moments`` between all fake and all real points seen since ``reset``.

    Neither is a sum over batches, so the points are kept and, under DDP, all-gathered.
    """

    def __init__(self, stat="swd", output_transform=lambda x: x, device="cpu"):
        if stat not in STATS:
            raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
        self.stat = stat
        super().__init__(output_transform=output_transform, device=device)

    def reset(self):
        self._fake = []
        self._real = []

    def update(self, output):
        fake, real = output
        self._fake.append(fake.detach().to(self._device, torch.float64))
        self._real.append(real.detach().to(self._device, torch.float64))

    def compute(self):
        if not self._fake:
            raise NotComputableError("DistributionDistance needs at least one batch to compute")
        fake = _gather(torch.cat(self._fake))
        real = _gather(torch.cat(self._real))
        if self.stat == "swd":
            return sliced_wasserstein(fake, real)
        return moment_distance(fake, real)


def get_metric(engine_type, info, src_name="fake", tgt_name=("targets", "real"), stat="swd"):
    """A :class:`DistributionDistance` over ``y_pred[src_name]`` against ``target[tgt_name]``."""

    def output_transform(output):
        return get_value(output["y_pred"], src_name), get_value(output["target"], tgt_name)

    return DistributionDistance(stat=stat, output_transform=output_transform)
