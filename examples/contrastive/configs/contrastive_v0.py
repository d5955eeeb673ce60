"""SimCLR on two-view synthetic data, scored by a kNN probe on the encoder's features."""

from examples.contrastive.configs.base_utils import ckpt_dir
from gatle_ignite import base_config

DATASET = "examples.contrastive.dataloaders.two_view_dataset"
TASK = {
    "n_classes": 10,
    "d_content": 16,
    "d_style": 16,
    "obs_dim": 64,
    "proto_scale": 1.0,
    "content_sigma": 0.5,
    # At 1.5 raw inputs already score 0.94 kNN accuracy: too easy to prove any learning.
    "style_scale": 4.0,
    "num_workers": 0,
}


def get_config():
    """The run's config: every component named by its dotted module path."""
    cfg = base_config()
    cfg.name = "contrastive_ntxent"
    cfg.project_name = "gatle-contrastive"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.contrastive.trainer.contrastive_trainer"

    cfg.model_name = "examples.contrastive.models.encoder"
    cfg.model_params = {"in_dim": 64, "hidden": 256, "feat_dim": 128, "proj_dim": 32}

    cfg.train_ds_name = DATASET
    cfg.train_ds_params = {
        **TASK,
        "n": 4096,
        "bs": 256,
        "seed": 0,
        "shuffle": True,
        "drop_last": True,
        "stochastic_views": True,
    }
    cfg.valid_ds_name = DATASET
    cfg.valid_ds_params = {**TASK, "n": 1024, "bs": 256, "seed": 1, "shuffle": False}
    # Project fields: the trainer reads them, the framework does not.
    cfg.bank_ds_name = DATASET
    cfg.bank_ds_params = {**TASK, "n": 2048, "bs": 256, "seed": 2, "shard": False}
    cfg.knn_params = {"src_name": "h1", "k": 20, "temperature": 0.1}

    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "ntxent": {
                "cls_name": "examples.contrastive.losses.loss_functions.ntxent",
                "loss_params": {"src_a": "z1", "src_b": "z2", "temperature": 0.2},
                "weight": 1.0,
            },
        },
    }

    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 3e-3, "weight_decay": 1e-4}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.lr_scheduler_params = {"warmup_epochs": 1}
    cfg.max_epochs = 10
    cfg.every_val = 1

    # Empty on purpose: the trainer builds valid/knn itself, around its bank.
    cfg.val_metrics = {}
    cfg.score_name = "valid/knn"
    cfg.score_factor = 1

    cfg.logger_name = ["text"]
    cfg.amp_dtype = "fp32"
    return cfg
