"""prep_batch names the model's inputs "inputs" instead of "model_input"."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        return to_device({"inputs": {"x": x}, "targets": {"labels": y}})
