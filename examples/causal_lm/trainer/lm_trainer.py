"""The language model's trainer: the bytes in, the bytes that follow as the target."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        ids, next_ids = to_device(batch, self.device)
        return {"model_input": {"input_ids": ids}, "targets": {"labels": next_ids}}
