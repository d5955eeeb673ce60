"""Imbalanced 5-class noisy shapes: a CNN with augmentation, a balanced sampler and a tester.

``SHAPES_NO_SAMPLER=1`` runs the ablation: no sampler, a shuffled loader, and its own run name.
"""

import os

from examples.classification.configs.base_utils import ckpt_dir
from examples.classification.dataloaders.data_utils.shapes import DEPLOY_COUNTS, TRAIN_COUNTS
from gatle_ignite import base_config

N_CLASSES = 5
DATASET = "examples.classification.dataloaders.shapes_dataset"
METRICS = {
    "acc": {"cls_name": "examples.classification.metrics.accuracy", "params": {}},
    "top2": {"cls_name": "examples.classification.metrics.topk", "params": {"k": 2}},
    "bal_acc": {
        "cls_name": "examples.classification.metrics.per_class",
        "params": {"per_class": True},
    },
}


def get_config():
    """The run's config: every component named by its dotted module path."""
    no_sampler = os.environ.get("SHAPES_NO_SAMPLER") == "1"
    cfg = base_config()
    cfg.name = "shapes_cnn_nosampler" if no_sampler else "shapes_cnn"
    cfg.project_name = "gatle-classification"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.classification.trainer.classification_trainer"

    cfg.model_name = "examples.classification.models.shapes_cnn"
    cfg.model_params = {"n_classes": N_CLASSES, "width": 16, "dropout": 0.1, "in_ch": 1}

    cfg.aug_name = "examples.classification.augmentation.shapes_aug"
    cfg.aug_params = {"p_flip": 0.5, "noise": 0.05, "max_shift": 2, "brightness": 0.2}

    train = {"split": "train", "seed": 0, "bs": 64, "num_workers": 0, "drop_last": True}
    if no_sampler:
        train["shuffle"] = True
    else:
        # The sampler owns the order, so train sets no shuffle.
        train["sampler_params"] = {
            "cls_name": "examples.classification.dataloaders.data_utils.balanced_sampler",
            "params": {"num_samples": sum(TRAIN_COUNTS), "num_classes": N_CLASSES},
        }
    valid = {"bs": 256, "num_workers": 0, "shuffle": False, "split": "valid", "seed": 1}
    test = {**valid, "split": "test", "seed": 2, "class_counts": DEPLOY_COUNTS}
    cfg.train_ds_name = DATASET
    cfg.train_ds_params = train
    cfg.valid_ds_name = DATASET
    cfg.valid_ds_params = valid
    cfg.test_ds_name = DATASET
    cfg.test_ds_params = test

    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "ce": {
                "cls_name": "examples.classification.losses.loss_functions.cross_entropy",
                "loss_params": {"label_smoothing": 0.05},
                "weight": 1.0,
            },
        },
    }

    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 3e-3, "weight_decay": 0.01}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.lr_scheduler_params = {"warmup_epochs": 1, "lr_scale_factor": 0.01}
    cfg.max_epochs = 10
    cfg.grad_clip_norm = 1.0

    cfg.val_metrics = METRICS
    cfg.tester_metrics = METRICS
    cfg.every_val = 1
    cfg.every_test = 5
    cfg.score_name = "valid/bal_acc"
    cfg.score_factor = 1
    cfg.tester_score_name = "test/bal_acc"
    cfg.tester_score_factor = 1

    cfg.logger_name = ["text"]
    cfg.amp_dtype = "fp32"
    return cfg
