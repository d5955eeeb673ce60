"""Template for ``main_runner``: a ``BaseTrainer`` subclass, built as ``Trainer(local_rank, cfg)``.

Only ``prep_batch`` is required. The other methods are optional overrides, each written as the
skeleton to start from; delete the ones your task does not need.
"""

import torch

from gatle_ignite import BaseTrainer, EngineSpec, to_device

BACKBONE_GRAD_SCALE = 0.1


class Trainer(BaseTrainer):
    """A classifier trainer with a third engine (``probe``) and a slower-learning backbone."""

    def prep_batch(self, batch, split="train", **kwargs):
        """Split a raw batch into what the model takes and what losses and metrics compare."""
        x, y = batch
        return to_device({"model_input": {"x": x}, "targets": {"labels": y}}, self.device)

    def eval_specs(self):
        """Adds a ``probe`` engine; its config needs probe_ds_name, probe_metrics, every_probe."""
        return super().eval_specs() + (EngineSpec.for_split("probe"),)

    def backward(self, loss, step=True):
        """Scale the backbone's gradients by 0.1 before each optimizer step.

        ``step`` is False on the micro-batches inside an accumulation window: the gradients are
        only accumulated then. This override assumes no GradScaler (fp32 or bf16, not fp16).
        """
        loss.backward()
        if not step:
            return
        for name, param in self.model.named_parameters():
            if name.startswith("backbone.") and param.grad is not None:
                param.grad.mul_(BACKBONE_GRAD_SCALE)
        self._clip_grads(self.model)
        self.optimizer.step()

    def forward(self, model_input):
        """How the model is called; change it for positional inputs or a second model."""
        return self.model(**model_input)

    def eval_step(self, engine, batch, split="valid"):
        """One evaluation batch: no gradients, no losses."""
        self.model.eval()
        x = self.prep_batch(batch, split=split)
        with torch.no_grad(), self._autocast():
            y_pred = self.forward(x["model_input"])
        return {"y_pred": y_pred, "target": x}

    def train_step(self, engine, batch, split="train"):
        """One training batch, with gradient accumulation; edit it for a custom update."""
        self.model.train()
        window, is_first, is_step = self._accum_window(engine)
        if is_first:
            self.optimizer.zero_grad(set_to_none=True)
        # Under DDP, skips the gradient all-reduce on batches that do not step.
        with self._maybe_no_sync(is_step):
            x = self.prep_batch(batch, split=split)
            with self._autocast():
                y_pred = self.forward(x["model_input"])
                loss, dict_losses = self.loss_fn(y_pred, x, iteration=engine.state.iteration)
            self.backward(loss / window, step=is_step)
        # Every key in "losses" becomes a train/<key>_avg metric: "loss" and each "loss_<term>".
        return {"y_pred": y_pred, "target": x, "losses": {"loss": loss, **dict_losses}}

    def _autocast(self):
        return torch.autocast(
            device_type=self.device_type, dtype=self.dtype, enabled=self.autocast_enabled
        )
