"""The fraction of next tokens the model ranks first, over every position of the split."""

from ignite.metrics import Accuracy

from gatle_ignite import get_value


def get_metric(engine_type, info, src_name="logits", tgt_name=("targets", "next_tokens"), **kwargs):
    """An ignite ``Accuracy`` with one row of logits and one target per predicted token."""

    def output_transform(output):
        logits = get_value(output["y_pred"], src_name)
        tokens = get_value(output["target"], tgt_name)
        return logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)

    return Accuracy(output_transform=output_transform, **kwargs)
