"""Split a model's trainable parameters into weight-decay and no-decay groups, named."""

from typing import Any, Optional

from torch import nn

__all__ = ["get_grouped_params", "param_group_names"]


def get_grouped_params(
    model: nn.Module, weight_decay: Optional[float], no_decay_on_bias_and_norm: bool = True
) -> list[dict[str, Any]]:
    """Param groups: [decay, no_decay], or one group of everything when grouping is off."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not weight_decay or not no_decay_on_bias_and_norm:
        return [{"params": [p for _, p in named]}]
    decay, no_decay = [], []
    for name, param in named:
        # Biases and norm scales/shifts (all 1-d) are not regularised.
        if param.ndim <= 1 or name.endswith(".bias"):
            no_decay.append(param)
        else:
            decay.append(param)
    # Named, so that logs and plots can say which group a learning rate is.
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def param_group_names(optimizer) -> list:
    """The names of ``optimizer``'s param groups (their ``"name"`` key), in the order their
    learning rates are logged; empty when none is named (or there are no groups to name)."""
    groups = getattr(optimizer, "param_groups", None) or []
    names = [group.get("name") for group in groups if isinstance(group, dict)]
    if not any(isinstance(name, str) for name in names):
        return []
    return [name if isinstance(name, str) else f"group {i}" for i, name in enumerate(names)]
