"""The toy dataset with one faulty sample, read in DataLoader workers.

``fault_index`` is the sample that fails and ``fault`` how: ``"raise"`` (a corrupt sample, its
``__getitem__`` raises) or ``"segfault"`` (the worker reading it dies of SIGSEGV). Without
``fault_index`` every sample reads. ``item_sleep_s`` slows every read, so that a signal sent
after a few progress lines lands mid-run.
"""

import os
import signal
import time

from torch.utils.data import Dataset

from gatle_ignite import build_dataloader
from tests.toy.data import make_dataset


class Faulty(Dataset):
    def __init__(self, base, params):
        self.base = base
        self.fault_index = params.get("fault_index", -1)
        self.fault = params.get("fault", "raise")
        self.sleep_s = params.get("item_sleep_s", 0)

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        time.sleep(self.sleep_s)
        if index == self.fault_index:
            if self.fault == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            raise ValueError(f"sample {index} is corrupt")
        return self.base[index]


def get_ds(ds_params, transform=None):
    base = make_dataset(n=ds_params.get("n", 64), seed=ds_params.get("seed", 0))
    return build_dataloader(Faulty(base, ds_params), ds_params), {"length": len(base)}
