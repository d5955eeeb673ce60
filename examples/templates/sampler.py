"""Template for ``*_ds_params.sampler_params.cls_name``: ``get_sampler(dataset, **params)``."""

import torch
from torch.utils.data import WeightedRandomSampler


def get_sampler(dataset, num_samples=None, **kw):
    """Class-balanced sampling with replacement: each class is drawn equally often on average.

    Reads ``dataset.labels`` when the dataset has it; otherwise iterates the dataset once and
    takes the label from each ``(x, y)`` sample.
    """
    labels = getattr(dataset, "labels", None)
    if labels is None:
        labels = [int(dataset[i][1]) for i in range(len(dataset))]
    labels = torch.as_tensor(labels, dtype=torch.long)
    counts = torch.bincount(labels)
    weights = 1.0 / counts[labels].double()
    return WeightedRandomSampler(weights, num_samples=num_samples or len(labels), **kw)
