"""The resume benchmark's task: the synthetic example with samples that take ``cost_s`` to load
and a random augmentation drawn in the loader's workers, and a trainer that preempts itself
(SIGTERM) during the iteration ``GATLE_BENCH_STOP_AT`` names, as a scheduler would (not a
config field: the resumed run's config must be the same run's)."""

import os
import signal
import time

import torch
from torch.utils.data import Dataset

from examples.synthetic.dataloaders.synthetic_dataset import get_ds as synthetic_ds
from examples.synthetic.trainer.synthetic_trainer import Trainer as SyntheticTrainer
from gatle_ignite import build_dataloader

STOP_AT_ENV = "GATLE_BENCH_STOP_AT"


class Costly(Dataset):
    """Each sample sleeps ``cost_s`` (a read from disk or a decode), then is jittered."""

    def __init__(self, base, cost_s):
        self.base, self.cost_s = base, cost_s

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        time.sleep(self.cost_s)
        x, y = self.base[index]
        return x + 0.1 * torch.randn_like(x), y


def get_ds(ds_params, transform=None):
    base = synthetic_ds({**ds_params, "num_workers": 0})[0].dataset
    dataset = Costly(base, ds_params.get("cost_s", 0.002))
    return build_dataloader(dataset, ds_params), {"length": len(dataset)}


class Trainer(SyntheticTrainer):
    def __init__(self, local_rank, cfg):
        torch.set_num_threads(1)
        super().__init__(local_rank, cfg)

    def prep_batch(self, batch, split="train", **kwargs):
        stop_at = int(os.environ.get(STOP_AT_ENV, 0))
        if split == "train" and self.engines["trainer"].state.iteration == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().prep_batch(batch, split=split, **kwargs)
