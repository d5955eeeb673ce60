"""Stage 2: distil the frozen teacher into a tiny student trained on 256 samples."""

from examples.teacher_student.configs.base_utils import (
    STUDENT_DIR,
    STUDENT_PARAMS,
    STUDENT_TRAIN,
    TEACHER_PARAMS,
    VALID,
    teacher_ckpt,
)
from gatle_ignite import base_config

DS_NAME = "examples.teacher_student.dataloaders.teacher_student_dataset"
MLP = "examples.teacher_student.models.mlp"
LOSSES = "examples.teacher_student.losses.loss_functions"
METRICS = "examples.teacher_student.metrics"


def get_config():
    """The student's config; the teacher is described by project fields the framework ignores.

    Control run (hard labels only):
    ``--override criterion_params.dict_of_loss_params.kd.weight=0.0``.
    """
    cfg = base_config()
    cfg.name = "student_kd"
    cfg.project_name = "gatle-teacher-student"
    cfg.save_dir = str(STUDENT_DIR)
    cfg.main_runner = "examples.teacher_student.trainer.student_trainer"

    cfg.model_name = MLP
    cfg.model_params = dict(STUDENT_PARAMS)

    # Project fields: read by the student trainer only, never by the framework.
    cfg.teacher_model_name = MLP
    cfg.teacher_model_params = dict(TEACHER_PARAMS)
    cfg.teacher_weights = teacher_ckpt()
    cfg.teacher_autotrain = True

    cfg.train_ds_name = DS_NAME
    cfg.train_ds_params = dict(STUDENT_TRAIN)
    cfg.valid_ds_name = DS_NAME
    cfg.valid_ds_params = dict(VALID)

    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "ce": {
                "cls_name": f"{LOSSES}.cross_entropy",
                "loss_params": {"src_name": "logits", "tgt_name": ("targets", "labels")},
                "weight": 0.5,
            },
            "kd": {
                "cls_name": f"{LOSSES}.kd_loss",
                "loss_params": {
                    "src_name": "logits",
                    "tgt_name": ("targets", "teacher_logits"),
                    "temperature": 4.0,
                },
                "weight": 0.5,
            },
        },
    }

    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 3e-3, "weight_decay": 0.01}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.lr_scheduler_params = {"warmup_epochs": 2}
    cfg.max_epochs = 60

    cfg.val_metrics = {
        "acc": {
            "cls_name": f"{METRICS}.accuracy",
            "params": {"src_name": "logits", "tgt_name": ("targets", "labels")},
        },
        "teacher_agreement": {
            "cls_name": f"{METRICS}.agreement",
            "params": {"src_name": "logits", "tgt_name": ("targets", "teacher_logits")},
        },
    }
    cfg.score_name = "valid/acc"
    cfg.score_factor = 1

    cfg.logger_name = ["text"]
    cfg.log_every = 10_000
    cfg.amp_dtype = "fp32"
    return cfg
