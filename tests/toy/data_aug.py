"""The toy dataset with a random augmentation in __getitem__, so workers' random state matters."""

import torch
from torch.utils.data import Dataset

from gatle_ignite import build_dataloader
from tests.toy.data import make_dataset


class Jittered(Dataset):
    def __init__(self, base, scale):
        self.base, self.scale = base, scale

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        x, y = self.base[index]
        return x + self.scale * torch.randn_like(x), y


def get_ds(ds_params, transform=None):
    base = make_dataset(n=ds_params.get("n", 64), seed=ds_params.get("seed", 0))
    dataset = Jittered(base, ds_params.get("jitter", 0.1))
    return build_dataloader(dataset, ds_params), {"length": len(dataset)}
