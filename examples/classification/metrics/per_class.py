"""Balanced accuracy: the mean of the per-class accuracies, optionally published per class."""

import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from gatle_ignite import ConfigError, get_value


class PerClassAccuracy(Metric):
    """Mean accuracy over the classes that have support.

    With ``per_class=True``, ``completed()`` also writes ``<name>_<class>`` for each such class.
    """

    def __init__(
        self, num_classes, class_names=None, per_class=False, output_transform=lambda x: x
    ):
        self.num_classes = num_classes
        self.class_names = list(class_names or range(num_classes))
        self.per_class = per_class
        super().__init__(output_transform=output_transform)

    @reinit__is_reduced
    def reset(self):
        self._correct = torch.zeros(self.num_classes, dtype=torch.long, device=self._device)
        self._support = torch.zeros(self.num_classes, dtype=torch.long, device=self._device)

    @reinit__is_reduced
    def update(self, output):
        logits, labels = output[0].detach(), output[1].detach().to(self._device)
        hits = logits.argmax(dim=1).to(self._device) == labels
        self._support += torch.bincount(labels, minlength=self.num_classes)
        self._correct += torch.bincount(labels[hits], minlength=self.num_classes)

    def _per_class(self):
        seen = self._support > 0
        return seen, self._correct[seen].double() / self._support[seen].double()

    @sync_all_reduce("_correct", "_support")
    def compute(self):
        seen, accs = self._per_class()
        if not seen.any():
            raise NotComputableError("PerClassAccuracy needs at least one example before compute()")
        return accs.mean().item()

    def completed(self, engine, name):
        super().completed(engine, name)
        if not self.per_class:
            return
        # compute() has all-reduced the counters in place, so these are the global values.
        seen, accs = self._per_class()
        classes = [c for c, s in zip(self.class_names, seen.tolist()) if s]
        for cls, acc in zip(classes, accs.tolist()):
            engine.state.metrics[f"{name}_{cls}"] = acc


def get_metric(
    engine_type, info, per_class=False, src_name="logits", tgt_name=("targets", "labels")
):
    """Balanced accuracy over ``info["num_classes"]`` classes, named by ``info["class_names"]``."""
    if "num_classes" not in info:
        raise ConfigError(
            f"per_class accuracy needs info['num_classes'], but the {engine_type} split's get_ds "
            f"returned info with keys {sorted(info)}.\n"
            f"  Add 'num_classes' to the info dict that get_ds returns."
        )

    def output_transform(output):
        return get_value(output["y_pred"], src_name), get_value(output["target"], tgt_name)

    return PerClassAccuracy(
        info["num_classes"],
        class_names=info.get("class_names"),
        per_class=per_class,
        output_transform=output_transform,
    )
