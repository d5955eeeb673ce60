"""The toy task's trainer for models that compute their loss: the labels go to the model too."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        return to_device({"model_input": {"x": x, "labels": y}, "targets": {"labels": y}})
