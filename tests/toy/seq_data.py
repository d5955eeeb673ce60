"""Token sequences for the export tests: each batch of ``bs`` consecutive samples shares one
length, taken in turn from ``lengths``, so batches differ in length as padded batches do."""

import torch
from torch.utils.data import Dataset

from gatle_ignite import build_dataloader


class Sequences(Dataset):
    def __init__(self, n, lengths, bs, vocab, seed):
        self.lengths, self.bs = lengths, bs
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(1, vocab, (n, max(lengths)), generator=generator)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        length = self.lengths[(index // self.bs) % len(self.lengths)]
        ids = self.tokens[index, :length]
        # The label: whether the first token is above the vocabulary's middle, learnable.
        return ids, torch.ones_like(ids), int(ids[0] > 8) + int(ids[-1] > 8)


def get_ds(ds_params, transform=None):
    dataset = Sequences(
        n=ds_params.get("n", 64),
        lengths=list(ds_params.get("lengths", [8])),
        bs=ds_params["bs"],
        vocab=ds_params.get("vocab", 16),
        seed=ds_params.get("seed", 0),
    )
    return build_dataloader(dataset, ds_params), {"length": len(dataset)}
