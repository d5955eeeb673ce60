"""The digits task's trainer: only the batch mapping is task-specific."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    """Feeds the image to the CNN and keeps the digit as the target."""

    def prep_batch(self, batch, split="train", **kwargs):
        image, label = batch
        return to_device(
            {"model_input": {"image": image}, "targets": {"labels": label}}, self.device
        )
