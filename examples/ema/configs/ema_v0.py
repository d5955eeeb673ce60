"""EMA weights on a label-noise task: valid/acc scores the shadow, raw/acc the live model."""

from pathlib import Path

from examples.ema.configs.base_utils import ckpt_dir
from gatle_ignite import base_config

IN_DIM = 64
N_CLASSES = 10


def get_config():
    """The run's config: every component named by its dotted module path."""
    cfg = base_config()
    cfg.name = Path(__file__).stem
    cfg.project_name = "gatle-ema"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.ema.trainer.ema_trainer"

    cfg.model_name = "examples.ema.models.mlp"
    cfg.model_params = {"in_dim": IN_DIM, "hidden": 128, "n_classes": N_CLASSES}
    # A project field: the framework never reads it, the trainer's build_model does.
    cfg.ema_decay = 0.99

    common = {"in_dim": IN_DIM, "n_classes": N_CLASSES, "num_workers": 0}
    cfg.train_ds_name = "examples.ema.dataloaders.noisy_dataset"
    cfg.train_ds_params = {
        **common,
        "n": 2048,
        "bs": 16,
        "seed": 0,
        "shuffle": True,
        "drop_last": True,
        "label_noise": 0.2,
    }
    cfg.valid_ds_name = "examples.ema.dataloaders.noisy_dataset"
    cfg.valid_ds_params = {**common, "n": 1024, "bs": 128, "seed": 7, "shuffle": False}
    # No raw_ds_*: the trainer's raw engine shares the valid loader.

    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "ce": {
                "cls_name": "examples.ema.losses.loss_functions.cross_entropy",
                "loss_params": {"src_name": "logits", "tgt_name": ("targets", "labels")},
                "weight": 1.0,
            },
        },
    }

    cfg.optimizer_name = "gatle_ignite.optimizers.sgd"
    cfg.optimizer_params = {"lr": 0.15, "momentum": 0.9, "weight_decay": 0.0}
    cfg.max_epochs = 6

    acc = {
        "acc": {
            "cls_name": "examples.ema.metrics.accuracy",
            "params": {"src_name": "logits", "tgt_name": ("targets", "labels")},
        },
    }
    cfg.val_metrics = acc
    cfg.raw_metrics = acc
    # A declared engine must set its cadence, or setup() refuses it.
    cfg.every_raw = 1
    cfg.score_name = "valid/acc"
    cfg.score_factor = 1

    cfg.logger_name = ["text"]
    cfg.amp_dtype = "fp32"
    return cfg
