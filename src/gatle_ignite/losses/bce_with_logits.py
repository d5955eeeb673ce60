"""Binary cross-entropy on logits: one logit per target (binary or multi-label), labels 0 or 1."""

from torch import nn

from gatle_ignite.losses.term import ElementwiseTerm

__all__ = ["KWARGS_GO_TO", "Loss"]

# Where Loss's **kwargs go: pos_weight (a list, one per label), weight, reduction.
KWARGS_GO_TO = ((nn.BCEWithLogitsLoss, ()),)


class Loss(ElementwiseTerm):
    """``nn.BCEWithLogitsLoss(**kwargs)`` of ``y_pred[src_name]`` against ``target[tgt_name]``."""

    torch_loss = nn.BCEWithLogitsLoss
