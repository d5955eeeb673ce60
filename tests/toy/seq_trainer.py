"""The sequence task's trainer: only prep_batch."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        ids, mask, labels = batch
        return to_device({"model_input": {"ids": ids, "mask": mask}, "targets": {"labels": labels}})
