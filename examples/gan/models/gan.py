"""Generator and discriminator in one module, so one checkpoint entry holds both."""

from torch import nn


def _mlp(in_dim, hidden, out_dim):
    # Leaky, in both networks: a dead ReLU unit passes no gradient back to the generator.
    return nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, out_dim),
    )


class Model(nn.Module):
    """``gen``: z -> point; ``disc``: point -> one logit (no sigmoid; the loss takes logits).

    ``forward`` is the generator's, so the framework's default ``eval_step`` draws samples.
    """

    def __init__(self, z_dim=8, hidden=64, data_dim=2):
        super().__init__()
        self.z_dim = z_dim
        self.gen = _mlp(z_dim, hidden, data_dim)
        self.disc = _mlp(data_dim, hidden, 1)

    def forward(self, z):
        return {"fake": self.gen(z)}
