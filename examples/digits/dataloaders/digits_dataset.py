"""scikit-learn's bundled 8x8 digits, split 80/20 with a seeded permutation."""

from functools import cache

import torch
from sklearn.datasets import load_digits
from torch.utils.data import Dataset

from gatle_ignite import build_dataloader

N_TRAIN = 1437
NUM_CLASSES = 10


@cache
def load_split(split_seed=0):
    """``(images in [0, 1] as Nx1x8x8, labels, {split: indices}, (mean, std))``, built once."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(split_seed))
    indices = {"train": order[:N_TRAIN], "test": order[N_TRAIN:]}
    # Every split is normalised with the train split's statistics, so no split sees another's.
    train = images[indices["train"]]
    return images, labels, indices, (float(train.mean()), float(train.std()))


class DigitsDataset(Dataset):
    """``(image, label)`` pairs of one split; ``transform`` is applied to the train split only."""

    def __init__(self, split="train", split_seed=0, transform=None):
        if split not in ("train", "test"):
            raise ValueError(f"digits has splits 'train' and 'test', got {split!r}")
        images, labels, indices, (self.mean, self.std) = load_split(split_seed)
        self.split = split
        self.transform = transform
        # Positions in load_digits(), so a check can prove the splits are disjoint.
        self.indices = indices[split]
        self.images = images[self.indices]
        self.labels = labels[self.indices]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index]
        # Augment in [0, 1], where the affine's zero padding is the blank background.
        if self.transform is not None and self.split == "train":
            image = self.transform(image)
        return (image - self.mean) / self.std, self.labels[index]


def get_ds(ds_params, transform=None):
    """Build one split (``train`` or ``test``) from ``split`` and ``split_seed``."""
    ds = DigitsDataset(ds_params.get("split", "train"), ds_params.get("split_seed", 0), transform)
    return build_dataloader(ds, ds_params), {"length": len(ds), "num_classes": NUM_CLASSES}
