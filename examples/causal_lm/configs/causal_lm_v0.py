"""A 2-layer GPT-2 from transformers on bytes of Python's standard library: the built-in
cross-entropy and perplexity, the score lower-is-better, an export at any length up to 128."""

from examples.causal_lm.configs.base_utils import ckpt_dir
from gatle_ignite import base_config

DATA = "examples.causal_lm.dataloaders.text_bytes"


def get_config():
    cfg = base_config()
    cfg.name = "causal_lm"
    cfg.save_dir = ckpt_dir(cfg.name)
    cfg.main_runner = "examples.causal_lm.trainer.lm_trainer"
    cfg.model_name = "examples.causal_lm.models.gpt"
    gpt = {"vocab_size": 256, "n_positions": 128, "n_embd": 64, "n_layer": 2, "n_head": 4}
    # No cache: training needs none, and the export takes the logits alone.
    cfg.model_params = {**gpt, "use_cache": False, "bos_token_id": 0, "eos_token_id": 0}
    cfg.train_ds_name = cfg.valid_ds_name = DATA
    cfg.train_ds_params = {"split": "train", "length": 64, "stride": 61, "bs": 32, "shuffle": True}
    cfg.valid_ds_params = {"split": "valid", "length": 64, "bs": 64}
    cfg.criterion_name = "gatle_ignite.losses.cross_entropy"
    cfg.optimizer_name = "gatle_ignite.optimizers.adamw"
    cfg.optimizer_params = {"lr": 3e-3, "weight_decay": 0.01}
    cfg.lr_scheduler = "gatle_ignite.schedulers.warmup_cosine"
    cfg.lr_scheduler_params = {"warmup_epochs": 0.1}
    cfg.max_epochs = 2
    cfg.val_metrics = {
        "ppl": {"cls_name": "gatle_ignite.metrics.perplexity"},
        "acc": {"cls_name": "gatle_ignite.metrics.accuracy"},
    }
    cfg.score_name = "valid/ppl"
    cfg.score_mode = "min"
    cfg.amp_dtype = "fp32"
    # Every window is 64 bytes long; the export takes any length up to the position table.
    cfg.export_params = {"dynamic": {"input_ids": [1]}}
    return cfg
