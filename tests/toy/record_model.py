"""The toy MLP returning a dataclass, as libraries return their outputs: its logits, and the
cross-entropy it computes itself when it is given labels."""

import dataclasses
from typing import Optional

import torch
from torch.nn import functional as F

from tests.toy.model import Model as Toy


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    loss: Optional[torch.Tensor] = None


class Model(Toy):
    def forward(self, x, labels=None):
        logits = super().forward(x)["logits"]
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return Output(logits=logits, loss=loss)
