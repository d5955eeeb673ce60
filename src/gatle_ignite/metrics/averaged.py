"""Precision, recall and F1 over the split: per class, averaged over the classes, or of the
positive class of a binary task. Their shared ``get_metric``."""

from typing import Any, Callable, Optional, Union

from ignite import metrics
from ignite.metrics import Metric

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.losses.reading import Name
from gatle_ignite.metrics.transforms import DECISIONS, TWO_CLASSES, classified

__all__ = ["AVERAGES", "Precision", "Recall", "averaged_metric", "ignite_averaged"]

# "binary": the positive class of one score per target. False: one value per class. The others
# are ignite's averages over the classes; one score per target counts two classes, 0 and 1.
AVERAGES = ("macro", "micro", "weighted", False, "binary")


class _SkipsEmpty:
    """Leaves out a batch with nothing to count (every target ``ignore_index``), on which
    ignite's precision and recall fail; the split's counts are the same without it."""

    def update(self, output: tuple) -> None:
        if output[1].numel():
            super().update(output)


class Precision(_SkipsEmpty, metrics.Precision):
    """ignite's ``Precision``, leaving out a batch with nothing to count."""


class Recall(_SkipsEmpty, metrics.Recall):
    """ignite's ``Recall``, leaving out a batch with nothing to count."""


_AVERAGE_DOC = """

    ``average``: ``"macro"`` (the mean over the classes; one score per target counts two
    classes, 0 and 1){more}, False for one value per class, or ``"binary"`` for the positive
    class of one score per target (positive above ``threshold``). ``ignore_index`` leaves
    those target positions out.
    """


def averaged_metric(
    build: Callable[..., Metric], averages: tuple, what: str, module: str
) -> Callable[..., Metric]:
    """The ``get_metric`` of ``module``: ``build(transform, average, **kwargs)`` over the
    class predictions of a step, for an ``average`` among ``averages``."""

    def get_metric(
        engine_type: str,
        info: dict,
        src_name: Name = "logits",
        tgt_name: Name = ("targets", "labels"),
        average: Union[str, bool] = "macro",
        ignore_index: Optional[int] = None,
        threshold: float = 0.0,
        **kwargs: Any,
    ) -> Metric:
        if average not in averages:
            raise ConfigError(
                f"{what}: average={average!r} is not one of {', '.join(map(repr, averages))}.\n"
                f"  Set it in the metric's params."
            )
        kind = DECISIONS if average == "binary" else TWO_CLASSES
        transform = classified(src_name, tgt_name, ignore_index, threshold, kind=kind, what=what)
        return build(transform, average, **kwargs)

    more = ', ``"micro"`` or ``"weighted"``' if "micro" in averages else ""
    get_metric.__doc__ = (build.__doc__ or "").rstrip() + _AVERAGE_DOC.format(more=more)
    # Where the pre-flight looks for KWARGS_GO_TO: the module a config names.
    get_metric.__module__ = module
    return get_metric


def ignite_averaged(metric: type) -> Callable[..., Metric]:
    """A ``build`` for ``averaged_metric`` making ignite's ``Precision`` or ``Recall``."""

    def build(transform: Callable, average: Union[str, bool], **kwargs: Any) -> Metric:
        # "binary": ignite's binary mode, which gives the positive class's value alone.
        average = False if average == "binary" else average
        return metric(output_transform=transform, average=average, **kwargs)

    build.__doc__ = (
        f"ignite's ``{metric.__name__}`` of ``y_pred[src_name]`` against ``target[tgt_name]``."
    )
    return build
