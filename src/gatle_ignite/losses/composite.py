"""The composite criterion: a weighted, optionally iteration-gated sum of config-built losses."""

import difflib
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import nn

from gatle_ignite.dispatch import ConfigError, import_entrypoint
from gatle_ignite.utils.batch import named_outputs

__all__ = ["ENTRY_KEYS", "Loss", "check_entries"]

_REQUIRED = ("cls_name", "weight")
# Every key an entry of dict_of_loss_params is read for.
ENTRY_KEYS = (*_REQUIRED, "loss_params", "start_iteration", "end_iteration")
# How alike a key must be to one of those to be taken for its misspelling ('weigth', 'loss_param').
_TYPO = 0.8


def _device_of(y_pred: Any) -> torch.device:
    """Where the model output lives, so gated-off zeros sit beside the active terms."""
    if isinstance(y_pred, torch.Tensor):
        return y_pred.device
    for value in (named_outputs(y_pred) or {}).values():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def check_entries(dict_of_loss_params: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse an empty mapping, an entry without a required key, or one with a misspelt key,
    which would be read as absent."""
    if not dict_of_loss_params:
        raise ConfigError(
            "criterion_params.dict_of_loss_params is empty.\n"
            "  Add at least one sub-loss: {<key>: {'cls_name': <dotted path>, 'weight': 1.0}}."
        )
    for key, entry in dict_of_loss_params.items():
        for name in entry:
            meant = difflib.get_close_matches(str(name), ENTRY_KEYS, n=1, cutoff=_TYPO)
            if name not in ENTRY_KEYS and meant:
                raise ConfigError(
                    f"loss entry {key!r} has {name!r}, which the composite never reads: did you "
                    f"mean {meant[0]!r}?\n  An entry's keys: {', '.join(ENTRY_KEYS)}."
                )
        for name in _REQUIRED:
            if entry.get(name) is None:
                raise ConfigError(
                    f"loss entry {key!r} is missing {name!r}.\n"
                    f"  Every entry of dict_of_loss_params needs a 'cls_name' (a module "
                    f"exposing Loss) and a 'weight'."
                )


class Loss(nn.Module):
    """Sum of ``weight * term(y_pred, target, iteration)`` over the active entries.

    The terms and their gates are fixed at construction; ``weighting`` is read on every call.
    """

    def __init__(self, dict_of_loss_params: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__()
        check_entries(dict_of_loss_params)
        self.dict_loss_functions = nn.ModuleDict()
        self.weighting: dict[str, float] = {}
        self.gating: dict[str, tuple[Optional[int], Optional[int]]] = {}
        for key, entry in dict_of_loss_params.items():
            loss_cls = import_entrypoint(
                entry["cls_name"], "Loss", field=f"dict_of_loss_params.{key}.cls_name"
            )
            self.dict_loss_functions[key] = loss_cls(**dict(entry.get("loss_params", {}) or {}))
            self.weighting[key] = entry["weight"]
            self.gating[key] = (entry.get("start_iteration"), entry.get("end_iteration"))
        self.crit_keys = list(dict_of_loss_params.keys())
        # Resolved once: a ModuleDict lookup and the gate test are Python calls on every step.
        self._terms = tuple(
            (key, f"loss_{key}", self.dict_loss_functions[key]) for key in self.crit_keys
        )
        self._gated = any(bounds != (None, None) for bounds in self.gating.values())

    def _is_active(self, key: str, iteration: Optional[int]) -> bool:
        start, end = self.gating[key]
        if iteration is None or (start is None and end is None):
            return True
        return (start is None or start <= iteration) and (end is None or iteration <= end)

    def forward(
        self, y_pred: Any, target: Any, iteration: Optional[int] = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Return ``(total, {"loss_<key>": weighted value})``; gated-off terms report 0.0."""
        total = None
        components = {}
        for key, name, term in self._terms:
            if self._gated and not self._is_active(key, iteration):
                # Keep the key so each logged series stays continuous across the gate.
                components[name] = torch.zeros((), device=_device_of(y_pred))
                continue
            value = term(y_pred, target, iteration)
            weight = self.weighting[key]
            if weight != 1:
                value = weight * value
            components[name] = value
            total = value if total is None else total + value
        if total is None:
            raise ConfigError(
                f"all loss terms are gated off at iteration {iteration}: {self.gating}.\n"
                f"  Widen a start_iteration / end_iteration window so at least one term is active."
            )
        return total, components
