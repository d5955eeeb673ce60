"""Toy speech translation: noisy frames of spoken words in, reversed translated tokens out."""

import torch
from torch.utils.data import Dataset

from examples.translation.dataloaders.data_utils.vocab import (
    EOS_ID,
    MAX_FRAMES,
    MAX_WORDS,
    MIN_FRAMES,
    MIN_WORDS,
    N_WORDS,
    PAD_ID,
    TGT_VOCAB,
    target_tokens,
)
from gatle_ignite import build_dataloader

NOISE = 0.15
ITEM_STRIDE = 1_000_003


class Utterances(Dataset):
    """Item ``idx`` is generated from its own seed, so an index always returns the same sample."""

    def __init__(self, n, in_dim=32, seed=0, task_seed=1234):
        # The word prototypes come from task_seed alone: every split speaks the same language.
        task_gen = torch.Generator().manual_seed(task_seed)
        self.prototypes = torch.randn(N_WORDS, in_dim, generator=task_gen)
        self.n = n
        self.seed = seed

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        gen = torch.Generator().manual_seed(self.seed * ITEM_STRIDE + idx)
        n_words = int(torch.randint(MIN_WORDS, MAX_WORDS + 1, (), generator=gen))
        words = torch.randint(0, N_WORDS, (n_words,), generator=gen)
        frames = torch.randint(MIN_FRAMES, MAX_FRAMES + 1, (n_words,), generator=gen)
        clean = self.prototypes[words].repeat_interleave(frames, dim=0)
        feats = clean + NOISE * torch.randn(clean.shape, generator=gen)
        return feats, torch.tensor(target_tokens(words.tolist()))


def collate_fn(items):
    """Pad a list of ``(feats (T, D), tokens (U,))`` into the batch dict the trainer reads."""
    feats, tokens = zip(*items)
    batch, in_dim = len(feats), feats[0].shape[1]
    src_len = max(f.shape[0] for f in feats)
    tgt_len = max(t.shape[0] for t in tokens)
    src_feats = torch.zeros(batch, src_len, in_dim)
    src_pad_mask = torch.ones(batch, src_len, dtype=torch.bool)
    tgt = torch.full((batch, tgt_len), PAD_ID, dtype=torch.long)
    for i, (f, t) in enumerate(items):
        src_feats[i, : f.shape[0]] = f
        src_pad_mask[i, : f.shape[0]] = False
        tgt[i, : t.shape[0]] = t
    return {
        "src_feats": src_feats,
        "src_pad_mask": src_pad_mask,
        "tgt_in": tgt[:, :-1],
        "tgt_out": tgt[:, 1:],
    }


def get_ds(ds_params, transform=None):
    """Build one split; ``transform`` is not used by this task."""
    ds = Utterances(
        n=ds_params.get("n", 1024),
        in_dim=ds_params.get("in_dim", 32),
        seed=ds_params.get("seed", 0),
        task_seed=ds_params.get("task_seed", 1234),
    )
    # Variable-length items need a padding collate; passed through ds_params, so the
    # framework's exact-sharded eval loader uses it too.
    loader = build_dataloader(ds, {**ds_params, "collate_fn": collate_fn})
    info = {"length": len(ds), "pad_id": PAD_ID, "eos_id": EOS_ID, "tgt_vocab": TGT_VOCAB}
    return loader, info
