"""A tiny causal LM from ``transformers`` (built from a config, no weights), on random token
blocks: the model as the library returns it, a ``ModelOutput`` with its own loss."""

import torch
from torch.utils.data import TensorDataset

from gatle_ignite import BaseTrainer, build_dataloader, to_device

VOCAB = 32


def Model(n_layer=1, n_embd=16, n_head=2, block=8):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=block,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def get_ds(ds_params, transform=None):
    """Blocks of a repeating token pattern with noise: learnable, and every block full."""
    n, block = ds_params.get("n", 64), ds_params.get("block", 8)
    gen = torch.Generator().manual_seed(ds_params.get("seed", 0))
    starts = torch.randint(0, VOCAB, (n, 1), generator=gen)
    tokens = (starts + torch.arange(block)) % VOCAB
    return build_dataloader(TensorDataset(tokens), ds_params), {"length": n}


class Trainer(BaseTrainer):
    def prep_batch(self, batch, split="train", **kwargs):
        (tokens,) = batch
        # The model shifts its labels itself; the metrics score each position's logits against
        # the next token, the last position against nothing (-100).
        following = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -100)], dim=1)
        return to_device(
            {
                "model_input": {"input_ids": tokens, "labels": tokens},
                "targets": {"next": following},
            }
        )
