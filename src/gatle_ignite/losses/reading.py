"""How the built-in losses and metrics read their two sides from a step's output.

``src_name`` names the model's output: a key, a path (tuple) into it, or None for the output
itself. A model that returns one tensor (a ``timm`` or ``torchvision`` classifier) is read as
it is, whatever ``src_name`` says: it has no names to choose from. A dataclass output (a
``transformers`` ``ModelOutput``) is read by its field names.

``tgt_name`` names a value of ``prep_batch``'s dict: a key or a path. A bare key that is not at
its top is looked up in its ``"targets"``, so ``"labels"`` reads ``("targets", "labels")``.
"""

from collections.abc import Mapping
from typing import Any, Union

import torch

from gatle_ignite.utils.batch import get_value

__all__ = ["Name", "read_prediction", "read_target"]

# A key, or a path of keys and indices.
Name = Union[str, int, tuple, list, None]


def read_prediction(y_pred: Any, src_name: Name) -> Any:
    """The model output ``src_name`` names."""
    if src_name is None or isinstance(y_pred, torch.Tensor):
        return y_pred
    return get_value(y_pred, src_name)


def read_target(prepared: Any, tgt_name: Name) -> Any:
    """The value of ``prep_batch``'s dict that ``tgt_name`` names."""
    if isinstance(tgt_name, str) and isinstance(prepared, Mapping) and tgt_name not in prepared:
        targets = prepared.get("targets")
        if isinstance(targets, Mapping) and tgt_name in targets:
            return targets[tgt_name]
    return get_value(prepared, tgt_name)
