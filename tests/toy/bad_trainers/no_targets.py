"""prep_batch returns the model's inputs and forgets the targets the loss reads."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        x, _y = batch
        return to_device({"model_input": {"x": x}})
