"""Mean squared error as a composite-loss term."""

from torch import nn

from gatle_ignite import get_value


class Loss(nn.Module):
    """``nn.MSELoss(**kwargs)`` between ``y_pred[src_name]`` and ``target[tgt_name]``."""

    def __init__(self, src_name="noise_pred", tgt_name=("targets", "noise"), **kwargs):
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name
        self.mse = nn.MSELoss(**kwargs)

    def forward(self, y_pred, target, iteration=None):
        return self.mse(get_value(y_pred, self.src_name), get_value(target, self.tgt_name))
