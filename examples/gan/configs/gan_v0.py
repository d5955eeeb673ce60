"""A GAN learning a correlated 2-D Gaussian, with its own optimizer, criterion and train step."""

import torch

from examples.gan.configs.base_utils import ckpt_dir
from gatle_ignite import base_config


def get_config():
    """The run's config: every component named by its dotted module path."""
    # Tiny networks: more threads cost more in synchronisation than they save.
    torch.set_num_threads(1)
    cfg = base_config()
    cfg.name = "gan_2d"
    cfg.project_name = "gatle-gan"
    cfg.save_dir = ckpt_dir("gan_2d")
    cfg.main_runner = "examples.gan.trainer.gan_trainer"

    cfg.model_name = "examples.gan.models.gan"
    cfg.model_params = {"z_dim": 8, "hidden": 64, "data_dim": 2}

    cfg.train_ds_name = "examples.gan.dataloaders.gaussian_2d"
    cfg.train_ds_params = {
        "n": 8192,
        "seed": 0,
        "bs": 256,
        "num_workers": 0,
        "shuffle": True,
        "drop_last": True,
    }
    cfg.valid_ds_name = "examples.gan.dataloaders.gaussian_2d"
    cfg.valid_ds_params = {"n": 4096, "seed": 99, "bs": 1024, "num_workers": 0, "shuffle": False}

    # A whole criterion, not the composite: the trainer calls its disc_loss and gen_loss.
    cfg.criterion_name = "examples.gan.losses.gan_loss"
    cfg.criterion_params = {"label_smoothing": 0.1}

    # Returns two Adams behind one object; there is no second optimizer field.
    cfg.optimizer_name = "examples.gan.optimizer.dual_optimizer"
    cfg.optimizer_params = {"gen_lr": 2e-3, "disc_lr": 1e-3, "betas": (0.5, 0.999)}
    cfg.max_epochs = 20

    cfg.val_metrics = {
        stat: {"cls_name": "examples.gan.metrics.distribution", "params": {"stat": stat}}
        for stat in ("swd", "moments")
    }
    cfg.every_val = 5
    # Lower is better, and checkpointing keeps the maximum.
    cfg.score_name = "valid/swd"
    cfg.score_factor = -1

    cfg.logger_name = ["text"]
    cfg.amp_dtype = "fp32"
    cfg.log_every = 100
    # The FLOP count runs the default step (one loss, one backward); this task's train_step
    # alternates two, so there is no single step to count.
    cfg.count_flops = False
    return cfg
