"""The toy task's features as a one-channel image two pixels high, passed to the model as
``KEY``."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    KEY = "pixel_values"

    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        image = x.reshape(len(x), 1, 2, -1)
        return to_device({"model_input": {self.KEY: image}, "targets": {"labels": y}})
