"""The toy trainer with an augmentation in prep_batch: noise from torch's generator on every
training batch, as a task augmenting on the device does."""

import torch

from tests.toy.trainer import Trainer as ToyTrainer


class Trainer(ToyTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        prepared = super().prep_batch(batch, split=split, **kwargs)
        if split == "train":
            x = prepared["model_input"]["x"]
            prepared["model_input"]["x"] = x + 0.1 * torch.randn_like(x)
        return prepared
