"""The image task's trainer: the image in as transformers names it, the digit as the target."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        image, label = to_device(batch, self.device)
        return {"model_input": {"pixel_values": image}, "targets": {"labels": label}}
