"""A loss module's mean over the split (``valid/loss``), weighted by each batch's samples.

The loss is any module a config could name as a criterion or a composite term: a built-in
(``gatle_ignite.losses.cross_entropy`` by default, ``model_loss`` for the loss a model computes
itself) or a project's own. Its keyword arguments (``src_name``, ``tgt_name``, torch's) are the
metric's other params. For a token-level mean across batches of unequal token counts, use
``perplexity``.
"""

from typing import Any

import ignite.distributed as idist
import torch
from ignite.metrics import Loss, Metric

from gatle_ignite.dispatch import call_with_params, import_entrypoint
from gatle_ignite.utils.batch import named_outputs

__all__ = ["DEFAULT_LOSS", "get_metric", "samples_in"]

DEFAULT_LOSS = "gatle_ignite.losses.cross_entropy"


def samples_in(prepared: Any) -> int:
    """The batch's sample count: the first dimension of the first tensor ``prep_batch``
    returned, its ``model_input`` first."""
    first = _first_tensor(prepared.get("model_input")) if hasattr(prepared, "get") else None
    first = first if first is not None else _first_tensor(prepared)
    return len(first) if first is not None else 1


def _first_tensor(value: Any):
    if isinstance(value, torch.Tensor):
        return value if value.dim() else None
    named = named_outputs(value)
    if named is not None:
        children = named.values()
    else:
        children = value if isinstance(value, (list, tuple)) else ()
    for child in children:
        found = _first_tensor(child)
        if found is not None:
            return found
    return None


def get_metric(
    engine_type: str,
    info: dict,
    loss_name: str = DEFAULT_LOSS,
    **loss_params: Any,
) -> Metric:
    """ignite's ``Loss`` over ``Loss(**loss_params)`` of the module ``loss_name``."""
    field = f"{engine_type}_metrics.<name>.params"
    loss_cls = import_entrypoint(loss_name, "Loss", field=f"{field}.loss_name")
    module = call_with_params(loss_cls, loss_params, field).to(idist.device())

    def mean_of(y_pred: Any, target: Any) -> torch.Tensor:
        value = module(y_pred, target)
        # A whole criterion (the composite) returns (total, components).
        return value[0] if isinstance(value, tuple) else value

    return Loss(
        mean_of,
        output_transform=lambda output: (output["y_pred"], output["target"]),
        batch_size=samples_in,
    )
