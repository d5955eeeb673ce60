"""Template for a composite-loss term (``dict_of_loss_params.<key>.cls_name``): a bare tensor."""

import torch.nn.functional as F
from torch import nn

from gatle_ignite import get_value


class Loss(nn.Module):
    """Focal loss between ``y_pred[src_name]`` (logits) and ``target[tgt_name]`` (class ids).

    ``gamma`` down-weights well-classified samples; ``gamma=0`` is plain cross-entropy.
    """

    def __init__(self, src_name="logits", tgt_name=("targets", "labels"), gamma=2.0):
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name
        self.gamma = gamma

    def forward(self, y_pred, target, iteration=None):
        logits = get_value(y_pred, self.src_name)
        labels = get_value(target, self.tgt_name)
        log_p = F.log_softmax(logits.float(), dim=1).gather(1, labels.unsqueeze(1)).squeeze(1)
        return (-((1 - log_p.exp()) ** self.gamma) * log_p).mean()
