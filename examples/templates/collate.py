"""Template for ``*_ds_params.collate_fn.cls_name``: ``get_collate_fn(**params)``."""

import torch
from torch.nn.utils.rnn import pad_sequence


def get_collate_fn(pad_id=0):
    """A collate for ``(sequence, label)`` samples of different lengths, padded with ``pad_id``."""

    def collate(samples):
        sequences = [torch.as_tensor(sequence) for sequence, _ in samples]
        return {
            "x": pad_sequence(sequences, batch_first=True, padding_value=pad_id),
            "lengths": torch.tensor([len(sequence) for sequence in sequences]),
            "y": torch.tensor([int(label) for _, label in samples]),
        }

    return collate
