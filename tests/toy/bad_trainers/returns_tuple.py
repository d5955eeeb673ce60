"""prep_batch returns the raw (x, y) tuple."""

from gatle_ignite import BaseTrainer


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        return x, y
