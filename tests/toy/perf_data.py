"""The toy data with two knobs for the telemetry tests: a sleep per sample, tokens per sample."""

import time

from torch.utils.data import Dataset

from gatle_ignite import build_dataloader
from tests.toy.data import make_dataset


class SlowDataset(Dataset):
    """Each sample takes ``delay`` seconds to load, like a slow disk or a heavy decoder."""

    def __init__(self, dataset, delay):
        self.dataset = dataset
        self.delay = delay

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        time.sleep(self.delay)
        return self.dataset[index]


def get_ds(ds_params, transform=None):
    dataset = make_dataset(n=ds_params.get("n", 64), seed=ds_params.get("seed", 0))
    if ds_params.get("sleep_s"):
        dataset = SlowDataset(dataset, ds_params["sleep_s"])
    info = {"length": len(dataset), "num_classes": 3}
    if ds_params.get("tokens_per_sample"):
        info["tokens_per_sample"] = ds_params["tokens_per_sample"]
    return build_dataloader(dataset, ds_params), info
