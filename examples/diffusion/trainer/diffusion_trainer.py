"""The DDPM trainer: targets are drawn per batch, evaluation runs the sampler."""

import torch

from examples.diffusion.models.model_utils.diffusion import Schedule
from gatle_ignite import BaseTrainer, to_device


class Trainer(BaseTrainer):
    """Trains the noise predictor; its evaluator scores samples drawn from the model."""

    def __init__(self, local_rank, cfg):
        super().__init__(local_rank, cfg)
        threads = cfg.diffusion.get("torch_threads")
        # Small matrices: on a shared CPU, extra threads cost more in contention than they give.
        if threads:
            torch.set_num_threads(threads)
        self.schedule = Schedule(cfg.diffusion["num_steps"]).to(self.device)

    def prep_batch(self, batch, split="train", **kwargs):
        (x0,) = batch
        x0 = to_device(x0, self.device)
        # Fresh steps and noise every batch: the dataset holds only clean points.
        t = self.schedule.sample_timesteps(len(x0), self.device)
        noise = torch.randn_like(x0)
        x_t = self.schedule.q_sample(x0, t, noise)
        return {"model_input": {"x_t": x_t, "t": t}, "targets": {"noise": noise, "x0": x0}}

    def eval_step(self, engine, batch, split="valid"):
        """Sample as many points as the batch holds; the metrics compare them with the batch."""
        engine.state.batch = None
        engine.state.output = None
        self.model.eval()
        x = self.prep_batch(batch, split=split)

        def eps_fn(x_t, t):
            return self.forward({"x_t": x_t, "t": t})["noise_pred"]

        with (
            torch.no_grad(),
            torch.autocast(
                device_type=self.device_type, dtype=self.dtype, enabled=self.autocast_enabled
            ),
        ):
            samples = self.schedule.p_sample_loop(eps_fn, x["targets"]["x0"].shape, self.device)
        return {"y_pred": {"samples": samples.float()}, "target": x}
