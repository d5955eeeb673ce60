"""Hinton-style distillation: KL between temperature-softened teacher and student outputs."""

import torch.nn.functional as F
from torch import nn

from gatle_ignite import get_value


def kd_divergence(student, teacher, temperature):
    """``KL(softmax(teacher / T) || softmax(student / T)) * T^2``, averaged over the batch.

    The ``T^2`` keeps the gradient scale independent of the temperature, so the term's weight
    means the same at any ``T``.
    """
    kl = F.kl_div(
        F.log_softmax(student / temperature, dim=-1),
        F.log_softmax(teacher / temperature, dim=-1),
        reduction="batchmean",
        log_target=True,
    )
    return kl * temperature * temperature


class Loss(nn.Module):
    """The distillation term between ``y_pred[src_name]`` and the teacher's ``target[tgt_name]``."""

    def __init__(self, src_name="logits", tgt_name=("targets", "teacher_logits"), temperature=4.0):
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name
        self.temperature = temperature

    def forward(self, y_pred, target, iteration=None):
        student = get_value(y_pred, self.src_name)
        # The teacher is a fixed target: no gradient may reach it through this term.
        teacher = get_value(target, self.tgt_name).detach()
        if student.shape != teacher.shape:
            raise ValueError(
                f"student logits {tuple(student.shape)} and teacher logits "
                f"{tuple(teacher.shape)} differ: both models need the same n_classes"
            )
        return kd_divergence(student, teacher, self.temperature)
