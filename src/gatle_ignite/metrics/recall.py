"""Recall over the split: averaged over the classes (macro, by default), per class, or of the
positive class of a binary task."""

from gatle_ignite.metrics.averaged import AVERAGES, Recall, averaged_metric, ignite_averaged

__all__ = ["KWARGS_GO_TO", "get_metric"]

# Where get_metric's **kwargs go: is_multilabel, device.
KWARGS_GO_TO = ((Recall, ("output_transform", "average")),)

get_metric = averaged_metric(ignite_averaged(Recall), AVERAGES, "recall", __name__)
