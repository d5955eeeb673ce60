"""Sequences of the Markov text, as ``(n, seq_len + 1)`` token ids: inputs and shifted targets."""

import torch
from torch.utils.data import TensorDataset

from examples.sharded_lm.dataloaders.data_utils.markov import sample_sequences, transition_matrix
from gatle_ignite import build_dataloader


def split_tokens(ds_params) -> torch.Tensor:
    """The split's token ids; the checks read the same ones."""
    # The chain has its own seed, so every split reads one grammar with its own samples.
    matrix = transition_matrix(
        ds_params.get("vocab", 32), ds_params.get("successors", 3), ds_params.get("task_seed", 1234)
    )
    length = ds_params.get("seq_len", 64) + 1
    return sample_sequences(ds_params.get("n", 1024), length, matrix, ds_params.get("seed", 0))


def get_ds(ds_params, transform=None):
    """Build one split; ``transform`` is not used by this task.

    ``tokens_per_sample`` (the tokens a sample trains on) gives the run's perf/tokens_per_s.
    """
    ds = TensorDataset(split_tokens(ds_params))
    info = {
        "length": len(ds),
        "vocab": ds_params.get("vocab", 32),
        "tokens_per_sample": ds_params.get("seq_len", 64),
    }
    return build_dataloader(ds, ds_params), info
