"""How often the student's top class is the teacher's top class."""

from ignite.metrics import Accuracy

from gatle_ignite import get_value


def get_metric(
    engine_type, info, src_name="logits", tgt_name=("targets", "teacher_logits"), **kwargs
):
    """An ignite ``Accuracy`` of ``y_pred[src_name]`` against the teacher logits' argmax."""

    def output_transform(output):
        teacher = get_value(output["target"], tgt_name)
        return get_value(output["y_pred"], src_name), teacher.argmax(dim=-1)

    return Accuracy(output_transform=output_transform, **kwargs)
