"""A trainer that keeps an EMA of the weights, evaluates it, and evaluates the live weights too."""

import contextlib

from examples.ema.models.model_utils.ema import EMA
from gatle_ignite import BaseTrainer, EngineSpec, to_device

# A second engine over the valid loader: `ds_prefix` makes it share, not rebuild, that split.
RAW_SPEC = EngineSpec.for_split("raw", ds_prefix="valid")


class Trainer(BaseTrainer):
    """Scores the EMA weights as ``valid/*`` and the live weights as ``raw/*`` on the same data."""

    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        return to_device({"model_input": {"x": x}, "targets": {"labels": y}}, self.device)

    def build_model(self):
        model = super().build_model()
        # Built here so it exists by the end of setup(), when checkpoints collect extra_to_save().
        self.ema = EMA(model, decay=self.cfg.ema_decay)
        return model

    def backward(self, loss, step=True):
        super().backward(loss, step=step)
        # Only after a real optimizer step: micro-batches of an accumulation window change nothing.
        if step:
            self.ema.update(self.model)

    def eval_specs(self):
        return super().eval_specs() + (RAW_SPEC,)

    @contextlib.contextmanager
    def eval_context(self, spec):
        if spec.key == RAW_SPEC.key:
            yield
            return
        backup = self.ema.apply_to(self.model)
        try:
            yield
        finally:
            EMA.restore(self.model, backup)

    def extra_to_save(self):
        return {"ema": self.ema}
