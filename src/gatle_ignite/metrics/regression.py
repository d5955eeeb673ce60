"""The built-in regression metrics' shared ``get_metric``: one ignite metric over every element
of every prediction."""

from typing import Any, Callable

from ignite.metrics import Metric

from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.transforms import regressed

__all__ = ["regression_metric"]


def regression_metric(metric: type, module: str) -> Callable[..., Metric]:
    """The ``get_metric`` of ``module`` for ``metric``, an ignite regression metric."""
    what = module.rsplit(".", 1)[-1]

    def get_metric(
        engine_type: str,
        info: dict,
        src_name: Name = "logits",
        tgt_name: Name = ("targets", "labels"),
        **kwargs: Any,
    ) -> Metric:
        return metric(output_transform=regressed(src_name, tgt_name, what=what), **kwargs)

    get_metric.__doc__ = f"""ignite's ``{metric.__name__}`` of ``y_pred[src_name]`` against a
    ``target[tgt_name]`` of its shape (a ``(B, 1)`` prediction against ``(B,)`` targets is
    compared as ``(B,)``)."""
    # Where the pre-flight looks for KWARGS_GO_TO: the module a config names.
    get_metric.__module__ = module
    return get_metric
