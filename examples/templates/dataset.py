"""Template for ``*_ds_name``: ``get_ds(ds_params, transform)`` returns ``(dataloader, info)``."""

import torch
from torch.utils.data import Dataset

from gatle_ignite import build_dataloader


class MyDataset(Dataset):
    """``n`` seeded random vectors labelled by a fixed random linear map.

    The framework hands the same ``transform`` to every split: it is applied only when
    ``split == "train"``, so evaluation sees clean inputs.
    """

    def __init__(
        self, root, split, n, seed, transform=None, in_dim=64, num_classes=10, task_seed=1234
    ):
        # A real dataset reads its files under ``root``; this one generates its samples.
        self.root = root
        self.split = split
        self.transform = transform if split == "train" else None
        # The labelling map has its own generator, so every split (each with its own seed)
        # shares one labelling function.
        task_gen = torch.Generator().manual_seed(task_seed)
        weights = torch.randn(in_dim, num_classes, generator=task_gen)
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, in_dim, generator=gen)
        # Public, so a sampler can balance classes without loading every sample.
        self.labels = (self.x @ weights).argmax(dim=1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        x = self.x[index]
        if self.transform is not None:
            x = self.transform(x)
        return x, self.labels[index]


def get_ds(ds_params, transform=None):
    """Build one split; ``bs``, ``shuffle``, ``sampler_params`` ... are read by build_dataloader.

    ``info`` reaches the split's metrics. A token model adds ``"tokens_per_sample"`` (the tokens
    a sample is padded to) to the training split's, and the run logs ``perf/tokens_per_s``.
    """
    num_classes = ds_params.get("num_classes", 10)
    ds = MyDataset(
        root=ds_params.get("root", "data"),
        split=ds_params.get("split", "train"),
        n=ds_params.get("n", 256),
        seed=ds_params.get("seed", 0),
        transform=transform,
        in_dim=ds_params.get("in_dim", 64),
        num_classes=num_classes,
        task_seed=ds_params.get("task_seed", 1234),
    )
    return build_dataloader(ds, ds_params), {"length": len(ds), "num_classes": num_classes}
