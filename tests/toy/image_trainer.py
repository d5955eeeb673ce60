"""The toy task's 8 features as a one-channel 2x4 image, passed to the model as ``KEY``."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    KEY = "pixel_values"

    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        image = x.reshape(-1, 1, 2, 4)
        return to_device({"model_input": {self.KEY: image}, "targets": {"labels": y}})
