"""A small decoder-only transformer on Markov text, sharded over 2 processes with FSDP2."""

from pathlib import Path

from examples.sharded_lm.configs.base_utils import ckpt_dir
from gatle_ignite import base_config

VOCAB = 32
SEQ_LEN = 64
DS_NAME = "examples.sharded_lm.dataloaders.markov_text"
NEXT_TOKENS = {"src_name": "logits", "tgt_name": ("targets", "next_tokens")}


def get_config():
    """The run's config: every component named by its dotted module path."""
    cfg = base_config()
    cfg.name = Path(__file__).stem
    cfg.project_name = "gatle-sharded-lm"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.sharded_lm.trainer.lm_trainer"

    cfg.model_name = "examples.sharded_lm.models.tiny_gpt"
    cfg.model_params = {"vocab": VOCAB, "dim": 64, "heads": 4, "layers": 2, "max_len": SEQ_LEN}

    # Each rank holds half of every parameter: one FSDP unit per Block, then the root. The
    # blocks' activations are recomputed in backward instead of kept.
    cfg.strategy = "fsdp"
    cfg.fsdp_params = {"wrap": ["Block"]}
    cfg.activation_checkpointing = ["Block"]
    # nccl by default: on GPUs it is used, on a CPU the launcher falls back to gloo.
    cfg.nproc_per_node = 2

    shared = {"vocab": VOCAB, "successors": 3, "task_seed": 1234, "seq_len": SEQ_LEN}
    cfg.train_ds_name = DS_NAME
    cfg.train_ds_params = {
        **shared,
        "n": 2048,
        "seed": 0,
        "bs": 32,
        "shuffle": True,
        "drop_last": True,
        "num_workers": 0,
    }
    cfg.valid_ds_name = DS_NAME
    cfg.valid_ds_params = {**shared, "n": 256, "seed": 1, "bs": 64, "num_workers": 0}

    cfg.criterion_name = "gatle_ignite.losses.composite"
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "ce": {
                "cls_name": "examples.sharded_lm.losses.loss_functions.token_ce",
                "loss_params": dict(NEXT_TOKENS),
                "weight": 1.0,
            },
        },
    }

    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 3e-3, "weight_decay": 0.01}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.lr_scheduler_params = {"warmup_epochs": 1}
    cfg.max_epochs = 6

    cfg.val_metrics = {
        "ppl": {"cls_name": "examples.sharded_lm.metrics.perplexity", "params": NEXT_TOKENS},
        "acc": {"cls_name": "examples.sharded_lm.metrics.token_accuracy", "params": NEXT_TOKENS},
    }
    # Lower is better: checkpointing keeps the maximum, so the best directory holds -ppl.
    cfg.score_name = "valid/ppl"
    cfg.score_factor = -1

    # The loop waits only for the copy to host memory; DCP writes the shards in the background.
    cfg.async_save = True

    cfg.logger_name = ["text"]
    cfg.amp_dtype = "fp32"
    return cfg
