"""One object holding the generator's and the discriminator's optimizers.

The framework keeps a single ``trainer.optimizer`` and only uses ``param_groups`` (LR logging),
``state_dict`` / ``load_state_dict`` (checkpoints) and ``zero_grad`` / ``step`` (the default
train step). This class offers exactly that surface, and refuses ``step``.
"""

import ignite.distributed as idist
import torch


class GanOptimizers:
    """``gen`` and ``disc`` torch optimizers behind the surface the framework touches."""

    def __init__(self, gen, disc):
        self.gen = gen
        self.disc = disc

    @property
    def param_groups(self):
        # G first, so the logged train/lr_0 is the generator's.
        return self.gen.param_groups + self.disc.param_groups

    def state_dict(self):
        return {"gen": self.gen.state_dict(), "disc": self.disc.state_dict()}

    def load_state_dict(self, state_dict):
        self.gen.load_state_dict(state_dict["gen"])
        self.disc.load_state_dict(state_dict["disc"])

    def zero_grad(self, set_to_none=True):
        self.gen.zero_grad(set_to_none=set_to_none)
        self.disc.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        raise RuntimeError(
            "GanOptimizers cannot step as one optimizer: the D and G phases step "
            "optimizer.disc and optimizer.gen separately (see the GAN trainer's train_step)."
        )


def get_optimizer(model, gen_lr=2e-4, disc_lr=2e-4, betas=(0.5, 0.999), **kwargs):
    """Adam for each network; ``kwargs`` reach both ``torch.optim.Adam`` calls."""
    net = getattr(model, "module", model)
    # Configs store tuples as lists; Adam wants a tuple.
    betas = tuple(betas)
    gen = torch.optim.Adam(net.gen.parameters(), lr=gen_lr, betas=betas, **kwargs)
    disc = torch.optim.Adam(net.disc.parameters(), lr=disc_lr, betas=betas, **kwargs)
    return GanOptimizers(idist.auto_optim(gen), idist.auto_optim(disc))
