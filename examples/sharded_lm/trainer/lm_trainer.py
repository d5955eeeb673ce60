"""The language model's trainer: only ``prep_batch``."""

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    """Feeds tokens 0..T-1 to the model; tokens 1..T are the targets."""

    def prep_batch(self, batch, split="train", **kwargs):
        (tokens,) = batch
        return to_device(
            {"model_input": {"tokens": tokens[:, :-1]}, "targets": {"next_tokens": tokens[:, 1:]}},
            self.device,
        )
