"""The synthetic linear-label task, with label noise on the splits that ask for it."""

import torch
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader


def get_ds(ds_params, transform=None):
    """Build one split; ``label_noise`` p replaces that fraction of labels at random."""
    n = ds_params.get("n", 1024)
    in_dim = ds_params.get("in_dim", 64)
    n_classes = ds_params.get("n_classes", 10)
    seed = ds_params.get("seed", 0)
    label_noise = ds_params.get("label_noise", 0.0)

    # W has its own generator so that every split, whatever its seed, shares one labelling.
    task_gen = torch.Generator().manual_seed(ds_params.get("task_seed", 1234))
    weights = torch.randn(in_dim, n_classes, generator=task_gen)

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=gen)
    y = (x @ weights).argmax(dim=1)

    if label_noise > 0:
        # A third generator: the noise must not shift the inputs drawn from `gen`.
        noise_gen = torch.Generator().manual_seed(seed + 999)
        replace = torch.rand(n, generator=noise_gen) < label_noise
        random_labels = torch.randint(n_classes, (n,), generator=noise_gen)
        y = torch.where(replace, random_labels, y)

    ds = TensorDataset(x, y)
    return build_dataloader(ds, ds_params), {"length": len(ds)}
