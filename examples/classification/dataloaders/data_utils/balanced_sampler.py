"""A sampler that draws every class equally often, whatever the dataset's imbalance."""

import torch
from torch.utils.data import WeightedRandomSampler

from gatle_ignite import ConfigError


def get_sampler(dataset, num_samples=None, num_classes=None, replacement=True):
    """A ``WeightedRandomSampler`` weighting each sample by 1 / (its class's count)."""
    labels = getattr(dataset, "labels", None)
    if labels is None:
        raise ConfigError(
            f"balanced_sampler needs a dataset with a `labels` property; "
            f"{type(dataset).__name__} has none.\n"
            f"  Expose the per-sample class labels as `dataset.labels`, or drop sampler_params."
        )
    labels = torch.as_tensor(labels, dtype=torch.long)
    counts = torch.bincount(labels, minlength=num_classes or 0).double()
    weights = 1.0 / counts[labels]
    return WeightedRandomSampler(
        weights, num_samples=num_samples or len(labels), replacement=replacement
    )
