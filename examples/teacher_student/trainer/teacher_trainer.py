"""Stage 1's trainer: a plain supervised ``prep_batch``."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    """Feeds ``x`` to the model and keeps ``y`` as the target."""

    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        return to_device({"model_input": {"x": x}, "targets": {"labels": y}}, self.device)
