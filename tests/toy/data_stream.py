"""The toy data as an IterableDataset: each DataLoader worker streams its own share, jittered
with random numbers drawn in the worker.

With ``stateful`` (the default) it has ``state_dict`` / ``load_state_dict``: each worker's copy
counts the samples its current pass has yielded, and a loaded count is where the next pass
starts. ``load_log`` names a file every sample read appends its index to.
"""

import torch
from torch.utils.data import IterableDataset, get_worker_info

from gatle_ignite import build_dataloader
from tests.toy.data import make_dataset


class Stream(IterableDataset):
    def __init__(self, base, scale, load_log=None):
        self.base, self.scale, self.load_log = base, scale, load_log
        self.yielded = 0
        self._start = 0

    def __len__(self):
        return len(self.base)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        indices = list(range(worker, len(self.base), workers))
        start, self._start = self._start, 0
        self.yielded = start
        for index in indices[start:]:
            if self.load_log:
                with open(self.load_log, "a") as log:
                    log.write(f"{index}\n")
            x, y = self.base[index]
            self.yielded += 1
            yield x + self.scale * torch.randn_like(x), y


class StatefulStream(Stream):
    def state_dict(self):
        return {"yielded": self.yielded}

    def load_state_dict(self, state):
        self._start = state["yielded"]


def get_ds(ds_params, transform=None):
    base = make_dataset(n=ds_params.get("n", 64), seed=ds_params.get("seed", 0))
    kind = StatefulStream if ds_params.get("stateful", True) else Stream
    dataset = kind(base, ds_params.get("jitter", 0.1), load_log=ds_params.get("load_log"))
    params = {key: value for key, value in ds_params.items() if key != "shuffle"}
    return build_dataloader(dataset, params), {"length": len(dataset)}
