"""Toy speech translation: a small Transformer maps noisy word frames to reversed tokens."""

from examples.translation.configs.base_utils import ckpt_dir
from examples.translation.dataloaders.data_utils.vocab import MAX_TGT_LEN, TGT_VOCAB
from gatle_ignite import base_config

DS_NAME = "examples.translation.dataloaders.translation_dataset"
EDIT_DISTANCE = "examples.translation.metrics.edit_distance"


def get_config():
    """The run's config: every component named by its dotted module path."""
    cfg = base_config()
    cfg.name = "translation"
    cfg.project_name = "gatle-translation"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.translation.trainer.translation_trainer"

    cfg.model_name = "examples.translation.models.seq2seq"
    cfg.model_params = {
        "in_dim": 32,
        "d_model": 64,
        "nhead": 4,
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "dim_feedforward": 128,
        "dropout": 0.0,
        "tgt_vocab": TGT_VOCAB,
        "max_decode_len": MAX_TGT_LEN,
    }

    common = {"in_dim": 32, "task_seed": 1234, "num_workers": 0}
    cfg.train_ds_name = DS_NAME
    cfg.train_ds_params = {
        **common,
        "n": 2048,
        "seed": 0,
        "bs": 64,
        "shuffle": True,
        "drop_last": True,
    }
    cfg.valid_ds_name = DS_NAME
    cfg.valid_ds_params = {**common, "n": 256, "seed": 7, "bs": 128, "shuffle": False}

    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "ce": {
                "cls_name": "examples.translation.losses.loss_functions.masked_ce",
                "loss_params": {"src_name": "logits", "tgt_name": ("targets", "tgt_out")},
                "weight": 1.0,
            },
        },
    }

    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 2e-3, "weight_decay": 0.01}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.lr_scheduler_params = {"warmup_epochs": 1}
    cfg.max_epochs = 10
    cfg.grad_clip_norm = 1.0

    decoded = {"src_name": "pred_tokens", "tgt_name": ("targets", "tgt_out")}
    cfg.val_metrics = {
        "wer": {"cls_name": EDIT_DISTANCE, "params": {**decoded, "mode": "wer"}},
        "exact": {"cls_name": EDIT_DISTANCE, "params": {**decoded, "mode": "exact"}},
    }
    # Lower is better: checkpointing keeps the maximum, so the best file holds -wer.
    cfg.score_name = "valid/wer"
    cfg.score_factor = -1

    cfg.logger_name = ["text"]
    cfg.amp_dtype = "fp32"
    return cfg
