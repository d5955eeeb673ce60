"""The toy task's config, shared by in-process tests and config files for subprocesses."""

from gatle_ignite import base_config


def toy_config(**fields):
    """A config for the toy task (tests.toy): 64 train / 32 valid samples, bs 16."""
    cfg = base_config()
    cfg.name = "toy"
    cfg.main_runner = "tests.toy.trainer"
    cfg.model_name = "tests.toy.model"
    cfg.train_ds_name = "tests.toy.data"
    cfg.train_ds_params = {"n": 64, "bs": 16, "shuffle": True, "seed": 0}
    cfg.valid_ds_name = "tests.toy.data"
    cfg.valid_ds_params = {"n": 32, "bs": 16, "seed": 1}
    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {"ce": {"cls_name": "tests.toy.loss", "weight": 1.0}}
    }
    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 1e-2, "weight_decay": 0.0}
    cfg.val_metrics = {"acc": {"cls_name": "tests.toy.metric"}}
    cfg.score_name = "valid/acc"
    cfg.amp_dtype = "fp32"
    cfg.max_epochs = 2
    cfg.logger_name = []
    # Every progress line, as on a terminal: tests read them from captured output and pipes.
    cfg.progress_seconds = 0.0
    for key, value in fields.items():
        cfg[key] = value
    return cfg
