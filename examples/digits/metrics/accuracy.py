"""Top-1 accuracy of the logits against the labels."""

from ignite.metrics import Accuracy

from gatle_ignite import get_value


def get_metric(engine_type, info, src_name="logits", tgt_name=("targets", "labels"), **kwargs):
    """An ignite ``Accuracy`` reading ``y_pred[src_name]`` and ``target[tgt_name]``."""

    def output_transform(output):
        return get_value(output["y_pred"], src_name), get_value(output["target"], tgt_name)

    return Accuracy(output_transform=output_transform, **kwargs)
