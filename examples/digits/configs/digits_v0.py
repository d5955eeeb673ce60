"""8x8 handwritten digits (scikit-learn's load_digits): a small CNN with train-time affine aug.

The held-out 20% serves both the evaluator and the tester, as MNIST's test set did in the MNIST
example this replaces. ``resume`` stays on: a first run warns that there is nothing to resume.
"""

from examples.digits.configs.base_utils import ckpt_dir
from gatle_ignite import base_config

DATASET = "examples.digits.dataloaders.digits_dataset"
METRICS = {"acc": {"cls_name": "examples.digits.metrics.accuracy", "params": {}}}


def get_config():
    """The run's config: every component named by its dotted module path."""
    cfg = base_config()
    cfg.name = "digits_cnn"
    cfg.project_name = "gatle-digits"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.digits.trainer.digits_trainer"

    cfg.model_name = "examples.digits.models.cnn"
    cfg.model_params = {"n_classes": 10, "width": 32, "dropout": 0.25}

    cfg.aug_name = "examples.digits.augmentation.digits_aug"
    cfg.aug_params = {"degrees": 10, "translate": 0.1}

    # num_workers > 0, so the dataset and the transform must pickle.
    common = {"bs": 64, "num_workers": 2, "split_seed": 0}
    cfg.train_ds_name = DATASET
    cfg.train_ds_params = {**common, "split": "train", "shuffle": True, "drop_last": True}
    cfg.valid_ds_name = DATASET
    cfg.valid_ds_params = {**common, "split": "test", "shuffle": False}
    cfg.test_ds_name = DATASET
    cfg.test_ds_params = {**common, "split": "test", "shuffle": False}

    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "ce": {
                "cls_name": "examples.digits.losses.loss_functions.cross_entropy",
                "loss_params": {"label_smoothing": 0.1},
                "weight": 1.0,
            },
        },
    }

    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 3e-3, "weight_decay": 0.01}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.lr_scheduler_params = {"warmup_epochs": 1, "lr_scale_factor": 0.01}
    cfg.max_epochs = 15
    cfg.grad_clip_norm = 1.0

    cfg.val_metrics = METRICS
    cfg.tester_metrics = METRICS
    cfg.every_val = 1
    cfg.every_test = 5
    cfg.score_name = "valid/acc"
    cfg.score_factor = 1

    cfg.logger_name = ["text", "pbar"]
    cfg.resume = True
    # amp_dtype stays at its default "auto": bf16 autocast on a capable GPU, fp32 on the CPU.
    return cfg
