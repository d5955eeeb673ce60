"""The GAN objective as a whole criterion: two losses the trainer calls by name."""

import torch
import torch.nn.functional as F
from torch import nn


class Loss(nn.Module):
    """Discriminator BCE with smoothed real targets, and the non-saturating generator loss.

    ``crit_keys`` makes the framework average ``loss_d`` and ``loss_g`` as
    ``train/loss_d_avg`` and ``train/loss_g_avg``. ``kwargs`` reach every BCE call.
    """

    crit_keys = ["d", "g"]

    def __init__(self, label_smoothing=0.1, **kwargs):
        super().__init__()
        self.label_smoothing = label_smoothing
        self.bce_kwargs = kwargs

    def _bce(self, logits, target_value):
        target = torch.full_like(logits, target_value)
        return F.binary_cross_entropy_with_logits(logits, target, **self.bce_kwargs)

    def disc_loss(self, real_logits, fake_logits):
        # Real targets below 1 keep D from growing over-confident and starving G of gradient.
        real = self._bce(real_logits, 1.0 - self.label_smoothing)
        return real + self._bce(fake_logits, 0.0)

    def gen_loss(self, fake_logits):
        # -log D(G(z)) rather than log(1 - D(G(z))): strong gradients while D still wins.
        return self._bce(fake_logits, 1.0)

    def forward(self, y_pred, target, iteration=None):
        raise RuntimeError(
            "the GAN loss has no single value: call disc_loss() and gen_loss() from train_step; "
            "it must never be reached through loss_fn"
        )
