"""A tiny sequence classifier for the export tests: token and position embeddings, a masked
mean over the sequence, a linear head.

``tied=True`` adds per-token logits from an output layer that shares the token embedding, as a
language model's does. ``positions="table"`` looks positions up in an ``nn.Embedding`` of
``max_len`` rows (the length is bounded by it); ``positions="fixed"`` adds a
``(1, max_len, dim)`` parameter, which pins the length to ``max_len``. ``output`` chooses what
forward returns: a dict, a dataclass, or a ``transformers`` ``ModelOutput``. ``hub_token``
stands for a credential a model takes (to fetch weights); it is not used."""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Classified:
    logits: torch.Tensor
    pooled: torch.Tensor
    extra: object = None


class Model(nn.Module):
    def __init__(
        self,
        vocab=16,
        dim=8,
        max_len=12,
        n_classes=3,
        positions="table",
        output="dict",
        tied=False,
        hub_token=None,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        if tied:
            self.unembed = nn.Linear(dim, vocab, bias=False)
            self.unembed.weight = self.embed.weight
        self.positions, self.output = positions, output
        if positions == "table":
            self.pos = nn.Embedding(max_len, dim)
        else:
            self.pos_table = nn.Parameter(torch.randn(1, max_len, dim) * 0.1)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, ids, mask):
        if self.positions == "table":
            where = self.pos(torch.arange(ids.shape[1], device=ids.device)).unsqueeze(0)
        else:
            where = self.pos_table
        hidden = self.embed(ids) + where
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
        logits = self.head(pooled)
        if self.output == "dataclass":
            return Classified(logits=logits, pooled=pooled)
        if self.output == "model_output":
            from transformers.modeling_outputs import SequenceClassifierOutput

            return SequenceClassifierOutput(logits=logits, hidden_states=(pooled,))
        if hasattr(self, "unembed"):
            return {"logits": logits, "tokens": self.unembed(hidden)}
        return {"logits": logits, "pooled": pooled}
