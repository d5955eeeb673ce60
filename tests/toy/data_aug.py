"""The toy dataset with a random augmentation in __getitem__, so workers' random state matters.

The augmentation draws from torch, NumPy and Python's generators alike. ``cost_s`` makes every
sample take that long to load; ``load_log`` names a file each load appends its index to, so a
test can see which samples a run loaded (from any worker process).
"""

import random
import time

import numpy as np
import torch
from torch.utils.data import Dataset

from gatle_ignite import build_dataloader
from tests.toy.data import make_dataset


class Jittered(Dataset):
    def __init__(self, base, scale, cost_s=0.0, load_log=None):
        self.base, self.scale = base, scale
        self.cost_s, self.load_log = cost_s, load_log

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        if self.cost_s:
            time.sleep(self.cost_s)
        if self.load_log:
            with open(self.load_log, "a") as log:
                log.write(f"{index}\n")
        x, y = self.base[index]
        shift = float(np.random.normal()) + random.random()
        return x + self.scale * (torch.randn_like(x) + shift), y


def get_ds(ds_params, transform=None):
    base = make_dataset(n=ds_params.get("n", 64), seed=ds_params.get("seed", 0))
    dataset = Jittered(
        base,
        ds_params.get("jitter", 0.1),
        cost_s=ds_params.get("cost_s", 0.0),
        load_log=ds_params.get("load_log"),
    )
    return build_dataloader(dataset, ds_params), {"length": len(dataset)}
