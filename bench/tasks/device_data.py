"""Random vectors kept on the run's device, one indexing op per batch, for the CUDA benchmark.

A per-sample ``TensorDataset`` collated on the CPU would starve a GPU, and so measure the
loader instead of the training step.
"""

import ignite.distributed as idist
import torch
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader


class DeviceTensors(TensorDataset):
    """Tensors on one device; the DataLoader fetches a whole batch with ``__getitems__``."""

    def __getitems__(self, indices):
        index, device = torch.as_tensor(indices), self.tensors[0].device
        if device.type == "cuda":
            # From pinned memory without blocking: a pageable upload would wait for the GPU on
            # every batch, in the bare loop too, and hide what the framework's reads cost.
            index = index.pin_memory().to(device, non_blocking=True)
        return tuple(t[index] for t in self.tensors)


def _whole_batch(batch):
    return batch


def get_ds(ds_params, transform=None):
    n = ds_params.get("n", 32768)
    in_dim = ds_params.get("in_dim", 1024)
    n_classes = ds_params.get("n_classes", 100)
    gen = torch.Generator().manual_seed(ds_params.get("seed", 0))
    x = torch.randn(n, in_dim, generator=gen)
    y = (x @ torch.randn(in_dim, n_classes, generator=gen)).argmax(dim=1)
    device = idist.device()
    dataset = DeviceTensors(x.to(device), y.to(device))
    params = {**dict(ds_params), "collate_fn": _whole_batch, "pin_memory": False}
    return build_dataloader(dataset, params), {"length": n}
