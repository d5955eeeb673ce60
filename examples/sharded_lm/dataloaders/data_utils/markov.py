"""The text's grammar: each token is drawn from a sparse Markov chain on the token two back.

Two interleaved chains, in effect. The previous token says almost nothing about the next one,
so a model has to attend two positions back to do better than a bigram table.
"""

import math

import torch

LAG = 2


def transition_matrix(vocab: int, successors: int, task_seed: int) -> torch.Tensor:
    """``(vocab, vocab)`` rows of next-token probabilities, each non-zero on ``successors``
    random tokens, from a generator of its own so every split shares one chain."""
    gen = torch.Generator().manual_seed(task_seed)
    allowed = torch.stack([torch.randperm(vocab, generator=gen)[:successors] for _ in range(vocab)])
    weights = torch.softmax(torch.randn(vocab, successors, generator=gen), dim=1)
    return torch.zeros(vocab, vocab).scatter_(1, allowed, weights)


def sample_sequences(n: int, length: int, matrix: torch.Tensor, seed: int) -> torch.Tensor:
    """``(n, length)`` token ids: the first ``LAG`` uniform, each later one from the chain."""
    gen = torch.Generator().manual_seed(seed)
    vocab = matrix.shape[0]
    tokens = torch.empty(n, length, dtype=torch.long)
    tokens[:, :LAG] = torch.randint(vocab, (n, LAG), generator=gen)
    for t in range(LAG, length):
        tokens[:, t] = torch.multinomial(matrix[tokens[:, t - LAG]], 1, generator=gen).squeeze(1)
    return tokens


def oracle_nll(tokens: torch.Tensor, matrix: torch.Tensor) -> float:
    """Mean next-token loss (nats) of the chain itself over ``tokens[:, 1:]``: the floor a
    model can reach. The token at position 1 has no token two back, so it costs ln(vocab)."""
    vocab = matrix.shape[0]
    drawn = matrix[tokens[:, :-LAG]].gather(2, tokens[:, LAG:, None]).squeeze(2)
    total = -drawn.log().sum() + (LAG - 1) * tokens.shape[0] * math.log(vocab)
    return float(total) / tokens[:, 1:].numel()
