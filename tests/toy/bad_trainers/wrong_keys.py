"""prep_batch's model_input key is not an argument of the model's forward(x)."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        return to_device({"model_input": {"inputs": x}, "targets": {"labels": y}})
