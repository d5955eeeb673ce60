"""A loss term that is NaN: gate it with start_iteration to make a run diverge on cue."""

import torch
from torch import nn


class Loss(nn.Module):
    def forward(self, y_pred, target, iteration=None):
        return y_pred["logits"].sum() * torch.tensor(float("nan"))
