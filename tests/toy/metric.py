"""Metrics for the framework's own tests."""

from ignite.metrics import Accuracy

from gatle_ignite import get_value


def get_metric(engine_type, info, src_name="logits", tgt_name=("targets", "labels")):
    return Accuracy(
        output_transform=lambda out: (
            get_value(out["y_pred"], src_name),
            get_value(out["target"], tgt_name),
        )
    )
