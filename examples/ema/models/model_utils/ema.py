"""An exponential moving average of a model's weights, checkpointable like any other state."""

import torch


def _unwrap(model):
    # Keys without DDP's `module.` prefix, matching the "model" entry ignite saves.
    return getattr(model, "module", model)


class EMA:
    """A shadow copy of ``model.state_dict()`` that trails the live weights.

    Float tensors are averaged; integer buffers (BatchNorm's ``num_batches_tracked``) are copied.
    With ``warmup`` the decay starts low, so early shadows are not dominated by the random init.
    """

    def __init__(self, model, decay=0.999, warmup=True):
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self.num_updates = 0
        # Cloned: state_dict() tensors share storage with the live weights.
        self.shadow = {k: v.detach().clone() for k, v in _unwrap(model).state_dict().items()}

    def effective_decay(self):
        if not self.warmup:
            return self.decay
        n = self.num_updates
        return min(self.decay, (1 + n) / (10 + n))

    @torch.no_grad()
    def update(self, model):
        decay = self.effective_decay()
        for key, value in _unwrap(model).state_dict().items():
            shadow = self.shadow[key]
            if shadow.is_floating_point():
                shadow.lerp_(value, 1.0 - decay)
            else:
                shadow.copy_(value)
        self.num_updates += 1

    def apply_to(self, model):
        """Load the shadow into ``model``; return the live weights to hand to ``restore``."""
        module = _unwrap(model)
        backup = {k: v.detach().clone() for k, v in module.state_dict().items()}
        module.load_state_dict(self.shadow)
        return backup

    @staticmethod
    def restore(model, backup):
        _unwrap(model).load_state_dict(backup)

    def state_dict(self):
        return {
            "decay": self.decay,
            "warmup": self.warmup,
            "num_updates": self.num_updates,
            "shadow": self.shadow,
        }

    @torch.no_grad()
    def load_state_dict(self, state_dict):
        self.decay = float(state_dict["decay"])
        self.warmup = bool(state_dict["warmup"])
        self.num_updates = int(state_dict["num_updates"])
        mismatched = set(self.shadow) ^ set(state_dict["shadow"])
        if mismatched:
            raise KeyError(f"EMA shadow keys do not match this model: {sorted(mismatched)}")
        # In place, so the tensors keep their device and anything holding them sees the update.
        for key, value in state_dict["shadow"].items():
            self.shadow[key].copy_(value)
