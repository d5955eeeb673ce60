"""Mean absolute error over the split: over every element of every prediction, any shape."""

from ignite.metrics import MeanAbsoluteError

from gatle_ignite.metrics.regression import regression_metric

__all__ = ["KWARGS_GO_TO", "get_metric"]

# Where get_metric's **kwargs go: device.
KWARGS_GO_TO = ((MeanAbsoluteError, ("output_transform",)),)

get_metric = regression_metric(MeanAbsoluteError, __name__)
