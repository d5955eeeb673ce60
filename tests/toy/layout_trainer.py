"""Targets for tests.toy.step_model's (B, 5, 10) logits in the layout the config's
``target_layout`` names: ``steps`` (B, 5) class indices, the right one; ``per_class`` (B, 10)
indices 0..9, which the layout rule reads with the 5 steps as classes; ``float_steps`` (B, 5)
floats. The per-class indices are under ``per_class`` too, whatever the layout."""

import torch

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        x, y = batch
        layout = self.cfg.get("target_layout", "steps")
        per_class = torch.arange(10).repeat(len(x), 1)
        labels = per_class if layout == "per_class" else y[:, None].repeat(1, 5)
        if layout == "float_steps":
            labels = labels.float()
        targets = {"labels": labels, "per_class": per_class}
        return to_device({"model_input": {"x": x}, "targets": targets})
