"""A ResNet from transformers (BatchNorm, random init) on 16x16 digits, augmented in prep_batch:
the built-in cross-entropy and accuracy, an export at any image size."""

from examples.resnet_digits.configs.base_utils import ckpt_dir
from gatle_ignite import base_config


def get_config():
    cfg = base_config()
    cfg.name = "resnet_digits"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.resnet_digits.trainer.image_trainer"
    cfg.model_name = "examples.resnet_digits.models.resnet"
    resnet = {"embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1]}
    cfg.model_params = {"num_channels": 1, "num_labels": 10, "layer_type": "basic", **resnet}
    cfg.train_ds_name = cfg.valid_ds_name = "examples.resnet_digits.dataloaders.digits"
    cfg.train_ds_params = {"split": "train", "size": 16, "bs": 32, "shuffle": True}
    cfg.valid_ds_params = {"split": "valid", "size": 16, "bs": 90}
    cfg.criterion_name = "gatle_ignite.losses.cross_entropy"
    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 3e-3}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.max_epochs = 10
    cfg.val_metrics = {"acc": {"cls_name": "gatle_ignite.metrics.accuracy"}}
    cfg.score_name = "valid/acc"
    # Trained at 16x16; the export takes any height and width.
    cfg.export_params = {"dynamic": {"pixel_values": [2, 3]}}
    return cfg
