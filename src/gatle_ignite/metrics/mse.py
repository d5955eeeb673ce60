"""Mean squared error over the split: over every element of every prediction, any shape."""

from ignite.metrics import MeanSquaredError

from gatle_ignite.metrics.regression import regression_metric

__all__ = ["KWARGS_GO_TO", "get_metric"]

# Where get_metric's **kwargs go: device.
KWARGS_GO_TO = ((MeanSquaredError, ("output_transform",)),)

get_metric = regression_metric(MeanSquaredError, __name__)
