"""Every template trained together: one config naming all of them by their dotted paths."""

from pathlib import Path

from examples.templates.configs.base_utils import ckpt_dir
from gatle_ignite import base_config

IN_DIM = 64
N_CLASSES = 10
LR = 1e-3
GAMMA = 0.5


def get_config():
    """The run's config: the template trainer, data, loss, optimizer, schedule and metric."""
    cfg = base_config()
    cfg.name = Path(__file__).stem
    cfg.project_name = "gatle-templates"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.templates.trainer"

    cfg.model_name = "examples.templates.model"
    cfg.model_params = {"in_dim": IN_DIM, "hidden": 32, "n_classes": N_CLASSES}

    cfg.aug_name = "examples.templates.augmentation"
    cfg.aug_params = {"p": 0.5, "scale": 0.01}

    shared = {"in_dim": IN_DIM, "num_classes": N_CLASSES, "n": 128, "bs": 32, "num_workers": 0}
    cfg.train_ds_name = "examples.templates.dataset"
    # The sampler owns the order, so the training split sets no "shuffle".
    sampler = {"cls_name": "examples.templates.sampler", "params": {"num_samples": 128}}
    cfg.train_ds_params = {**shared, "split": "train", "seed": 0, "sampler_params": sampler}
    cfg.valid_ds_name = "examples.templates.dataset"
    cfg.valid_ds_params = {**shared, "split": "valid", "seed": 1}

    # The probe engine declared by the template trainer's eval_specs().
    cfg.probe_ds_name = "examples.templates.dataset"
    cfg.probe_ds_params = {**shared, "split": "probe", "seed": 2}
    cfg.every_probe = 1

    term = "examples.templates.loss"
    targets = {"src_name": "logits", "tgt_name": ("targets", "labels")}
    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            # gamma 0 turns the focal term into plain cross-entropy.
            "ce": {"cls_name": term, "loss_params": {**targets, "gamma": 0.0}, "weight": 1.0},
            "focal": {"cls_name": term, "loss_params": {**targets, "gamma": 2.0}, "weight": 0.1},
        },
    }

    cfg.optimizer_name = "examples.templates.optimizer"
    cfg.optimizer_params = {"lr": LR, "weight_decay": 0.01}
    cfg.lr_scheduler = "examples.templates.scheduler"
    cfg.lr_scheduler_params = {"step_every_epochs": 1, "gamma": GAMMA}
    cfg.max_epochs = 2

    top2 = {"cls_name": "examples.templates.metric", "params": {**targets, "k": 2}}
    cfg.val_metrics = {"top2": top2}
    cfg.probe_metrics = {"top2": top2}
    cfg.score_name = "valid/top2"
    cfg.score_factor = 1

    cfg.logger_name = ["text"]
    cfg.amp_dtype = "fp32"
    return cfg
