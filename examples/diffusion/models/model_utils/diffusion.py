"""The DDPM noise schedule: forward noising in closed form and the ancestral sampler."""

import math

import torch


def cosine_betas(num_steps, s=0.008, max_beta=0.999):
    """Nichol & Dhariwal's cosine schedule; ``max_beta`` keeps the last step invertible."""
    steps = torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
    alpha_bar = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
    betas = 1 - alpha_bar[1:] / alpha_bar[:-1]
    return betas.clamp(max=max_beta).float()


class Schedule:
    """Betas and their products for ``num_steps`` diffusion steps (``t`` in ``[0, num_steps)``)."""

    def __init__(self, num_steps):
        self.num_steps = num_steps
        self.betas = cosine_betas(num_steps)
        self.alphas = 1 - self.betas
        self.alpha_bar = torch.cumprod(self.alphas, dim=0)
        self.alpha_bar_prev = torch.cat([torch.ones(1), self.alpha_bar[:-1]])

    def to(self, device):
        for name in ("betas", "alphas", "alpha_bar", "alpha_bar_prev"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def sample_timesteps(self, n, device):
        return torch.randint(self.num_steps, (n,), device=device)

    @staticmethod
    def _per_sample(values, t, like):
        return values[t].view(-1, *([1] * (like.dim() - 1)))

    def q_sample(self, x0, t, noise):
        """``x_t`` drawn from ``q(x_t | x0)`` with the given noise."""
        alpha_bar = self._per_sample(self.alpha_bar, t, x0)
        return alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise

    def p_sample_loop(self, eps_fn, shape, device, generator=None):
        """Ancestral sampling from pure noise; ``eps_fn(x_t, t)`` predicts the added noise."""
        x = torch.randn(shape, device=device, generator=generator)
        for step in reversed(range(self.num_steps)):
            t = torch.full((shape[0],), step, device=device, dtype=torch.long)
            eps = eps_fn(x, t).float()
            beta, alpha = self.betas[step], self.alphas[step]
            alpha_bar, alpha_bar_prev = self.alpha_bar[step], self.alpha_bar_prev[step]
            x = (x - beta / (1 - alpha_bar).sqrt() * eps) / alpha.sqrt()
            if step > 0:
                posterior_var = beta * (1 - alpha_bar_prev) / (1 - alpha_bar)
                noise = torch.randn(shape, device=device, generator=generator)
                x = x + posterior_var.sqrt() * noise
        return x
