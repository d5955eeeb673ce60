"""DDPM on an 8-mode 2-D ring; the evaluator samples from the model and scores the samples."""

from pathlib import Path

from examples.diffusion.configs.base_utils import ckpt_dir
from gatle_ignite import base_config

DATASET = "examples.diffusion.dataloaders.ring_dataset"
RING_STATS = "examples.diffusion.metrics.ring_stats"


def get_config():
    """The run's config: every component named by its dotted module path."""
    cfg = base_config()
    cfg.name = Path(__file__).stem
    cfg.project_name = "gatle-diffusion"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.diffusion.trainer.diffusion_trainer"

    cfg.model_name = "examples.diffusion.models.denoiser"
    cfg.model_params = {"dim": 2, "hidden": 256, "time_dim": 64, "n_layers": 3}
    # A project field: the trainer reads it, the framework does not.
    cfg.diffusion = {"num_steps": 200, "torch_threads": 1}

    cfg.train_ds_name = DATASET
    cfg.train_ds_params = {
        "n": 4096,
        "seed": 0,
        "bs": 256,
        "num_workers": 0,
        "shuffle": True,
        "drop_last": True,
    }
    cfg.valid_ds_name = DATASET
    # One batch of real points: the sampler draws as many, in one 200-step loop.
    cfg.valid_ds_params = {"n": 1024, "seed": 7, "bs": 1024, "num_workers": 0, "shuffle": False}

    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "eps": {
                "cls_name": "examples.diffusion.losses.loss_functions.mse",
                "loss_params": {"src_name": "noise_pred", "tgt_name": ("targets", "noise")},
                "weight": 1.0,
            },
        },
    }

    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 2e-3, "weight_decay": 0.0}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.lr_scheduler_params = {"warmup_epochs": 2}
    cfg.max_epochs = 60
    # Sampling costs 200 forward passes, so evaluate every 20 epochs only.
    cfg.every_val = 20

    cfg.val_metrics = {
        stat: {"cls_name": RING_STATS, "params": {"stat": stat}}
        for stat in ("mode_tv", "mode_dist", "radius_error")
    }
    # Lower is better: checkpointing keeps the maximum of score_factor x score.
    cfg.score_name = "valid/mode_dist"
    cfg.score_factor = -1

    cfg.logger_name = ["text"]
    cfg.amp_dtype = "fp32"
    return cfg
