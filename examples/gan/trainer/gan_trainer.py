"""A GAN trainer: its own train_step alternates a discriminator and a generator update."""

import dataclasses

import torch

from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    """D then G on every batch; evaluation is the default ``eval_step`` (the model samples)."""

    def _net(self):
        # The bare module under DDP, whose `gen`, `disc` and `z_dim` the phases use directly.
        return getattr(self.model, "module", self.model)

    def _autocast(self):
        return torch.autocast(
            device_type=self.device_type, dtype=self.dtype, enabled=self.autocast_enabled
        )

    def prep_batch(self, batch, split="train", **kwargs):
        (real,) = to_device(batch, self.device)
        z = torch.randn(real.shape[0], self._net().z_dim, device=real.device)
        return {"model_input": {"z": z}, "targets": {"real": real}}

    def train_spec(self):
        # There is no total GAN loss: keep train/loss_d_avg and train/loss_g_avg only.
        return dataclasses.replace(super().train_spec(), total_loss=False)

    def train_step(self, engine, batch, split="train"):
        engine.state.batch = None
        engine.state.output = None
        self.model.train()
        if self.accum_steps != 1:
            # The base train_step's accumulation is given up with it; refuse rather than ignore.
            raise NotImplementedError(
                f"{type(self).__name__}.train_step does not accumulate gradients; "
                f"set accum_steps = 1 (got {self.accum_steps})"
            )
        net, opt = self._net(), self.optimizer
        x = self.prep_batch(batch, split=split)
        z, real = x["model_input"]["z"], x["targets"]["real"]

        opt.disc.zero_grad(set_to_none=True)
        with self._autocast():
            # Detached: the D phase must not build (or pay for) a graph through G.
            fake = net.gen(z).detach()
            loss_d = self.criterion.disc_loss(net.disc(real), net.disc(fake))
        loss_d.backward()
        opt.disc.step()

        opt.gen.zero_grad(set_to_none=True)
        with self._autocast():
            fake = net.gen(z)
            loss_g = self.criterion.gen_loss(net.disc(fake))
        # This also leaves gradients on D; the next D phase zeroes them before they are used.
        loss_g.backward()
        opt.gen.step()

        return {
            "y_pred": {"fake": fake.detach()},
            "target": x,
            "losses": {"loss_d": loss_d.detach(), "loss_g": loss_g.detach()},
        }
