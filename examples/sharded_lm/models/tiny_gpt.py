"""A small decoder-only transformer. ``Block`` is the unit that FSDP shards and that activation
checkpointing recomputes."""

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t sees positions 0..t only."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        batch, length, dim = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(mixed.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    """Pre-norm attention then MLP, each added to the residual stream."""

    def __init__(self, dim, heads, mlp_ratio=4):
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim)
        )

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Model(nn.Module):
    """Token and learned position embeddings, ``layers`` blocks, a final norm, an LM head.

    ``forward(tokens)`` returns ``{"logits": (B * T, vocab)}``, one row per position, row
    ``b * T + t`` predicting token t + 1 of sequence b. Flat, because a Linear on a 3-D input
    returns a view, and FSDP2 warns at every call when the sharded root returns a view.
    """

    def __init__(self, vocab=32, dim=64, heads=4, layers=2, max_len=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(max_len, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return {"logits": self.head(self.norm(x).flatten(0, 1))}
