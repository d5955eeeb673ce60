"""How well samples cover a ring of Gaussian modes, against real points from it."""

import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from gatle_ignite import ConfigError, get_value

STATS = ("mode_tv", "mode_dist", "radius_error")


class RingDistributionStats(Metric):
    """One statistic of ``(samples, real points)`` relative to the mode ``centers``.

    * ``mode_tv``: total variation between the two nearest-mode histograms (mode coverage);
    * ``mode_dist``: mean distance from a sample to its nearest centre (sharpness);
    * ``radius_error``: mean ``| |sample| - radius |``, the radius being the centres' mean norm.

    Sums are float64: a diverged sampler's distances are huge, and float32 would lose the rest.
    """

    def __init__(self, centers, stat, output_transform=lambda x: x, device="cpu"):
        if stat not in STATS:
            raise ValueError(f"unknown ring statistic {stat!r}; choose one of {STATS}")
        self.centers = torch.as_tensor(centers, dtype=torch.float64)
        self.radius = self.centers.norm(dim=1).mean()
        self.stat = stat
        super().__init__(output_transform=output_transform, device=device)

    @reinit__is_reduced
    def reset(self):
        n_modes = len(self.centers)
        self._sample_hist = torch.zeros(n_modes, dtype=torch.float64, device=self._device)
        self._real_hist = torch.zeros(n_modes, dtype=torch.float64, device=self._device)
        self._dist_sum = torch.zeros((), dtype=torch.float64, device=self._device)
        self._radius_err_sum = torch.zeros((), dtype=torch.float64, device=self._device)
        self._count = torch.zeros((), dtype=torch.float64, device=self._device)

    def _nearest(self, points):
        return torch.cdist(points, self.centers.to(points.device)).min(dim=1)

    @reinit__is_reduced
    def update(self, output):
        samples, real = (t.detach().to(self._device, torch.float64) for t in output)
        dist, mode = self._nearest(samples)
        n_modes = len(self.centers)
        self._sample_hist += torch.bincount(mode, minlength=n_modes).double()
        self._real_hist += torch.bincount(self._nearest(real)[1], minlength=n_modes).double()
        self._dist_sum += dist.sum()
        self._radius_err_sum += (samples.norm(dim=1) - self.radius).abs().sum()
        self._count += len(samples)

    @sync_all_reduce("_sample_hist", "_real_hist", "_dist_sum", "_radius_err_sum", "_count")
    def compute(self):
        if self._count == 0:
            raise NotComputableError(f"RingDistributionStats({self.stat!r}) saw zero samples")
        if self.stat == "mode_tv":
            sample_p = self._sample_hist / self._sample_hist.sum()
            real_p = self._real_hist / self._real_hist.sum()
            return 0.5 * (sample_p - real_p).abs().sum().item()
        if self.stat == "mode_dist":
            return (self._dist_sum / self._count).item()
        return (self._radius_err_sum / self._count).item()


def get_metric(engine_type, info, stat, src_name="samples", tgt_name=("targets", "x0"), **kwargs):
    """A ring statistic of ``y_pred[src_name]`` against ``target[tgt_name]``."""
    if "mode_centers" not in info:
        raise ConfigError(
            f"ring_stats needs info['mode_centers'] from the {engine_type} split's get_ds, "
            f"got keys {sorted(info)}"
        )

    def output_transform(output):
        return get_value(output["y_pred"], src_name), get_value(output["target"], tgt_name)

    return RingDistributionStats(
        info["mode_centers"], stat, output_transform=output_transform, **kwargs
    )
