"""A small encoder-decoder Transformer: teacher forcing in training, greedy decoding otherwise."""

import warnings

import torch
from torch import nn

from examples.translation.dataloaders.data_utils.vocab import BOS_ID, EOS_ID, MAX_SRC_LEN, PAD_ID


class Model(nn.Module):
    """``forward`` returns ``{"logits"}`` when given ``tgt_in``, else ``{"pred_tokens"}``."""

    def __init__(
        self,
        in_dim=32,
        d_model=128,
        nhead=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=256,
        dropout=0.1,
        tgt_vocab=15,
        max_decode_len=6,
    ):
        super().__init__()
        self.max_decode_len = max_decode_len
        self.src_proj = nn.Linear(in_dim, d_model)
        self.src_pos = nn.Embedding(MAX_SRC_LEN, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        # Greedy decoding feeds BOS plus up to max_decode_len - 1 generated tokens.
        self.tgt_pos = nn.Embedding(max_decode_len, d_model)
        with warnings.catch_warnings():
            # Nested tensors only speed up post-norm encoders; torch warns that pre-norm
            # (chosen because it trains stably without a tuned warm-up) cannot use them.
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.transformer = nn.Transformer(
                d_model=d_model,
                nhead=nhead,
                num_encoder_layers=num_encoder_layers,
                num_decoder_layers=num_decoder_layers,
                dim_feedforward=dim_feedforward,
                dropout=dropout,
                batch_first=True,
                norm_first=True,
            )
        self.head = nn.Linear(d_model, tgt_vocab)

    def encode(self, src_feats, src_pad_mask):
        positions = torch.arange(src_feats.shape[1], device=src_feats.device)
        src = self.src_proj(src_feats) + self.src_pos(positions)
        return self.transformer.encoder(src, src_key_padding_mask=src_pad_mask)

    def decode(self, tgt_in, memory, src_pad_mask):
        """Next-token logits at every position of ``tgt_in``."""
        length = tgt_in.shape[1]
        positions = torch.arange(length, device=tgt_in.device)
        tgt = self.tgt_embed(tgt_in) + self.tgt_pos(positions)
        # True above the diagonal: position i may not attend to the tokens it must predict.
        causal = torch.ones(length, length, dtype=torch.bool, device=tgt_in.device).triu(1)
        hidden = self.transformer.decoder(
            tgt, memory, tgt_mask=causal, memory_key_padding_mask=src_pad_mask
        )
        return self.head(hidden)

    def forward(self, src_feats, src_pad_mask, tgt_in=None):
        memory = self.encode(src_feats, src_pad_mask)
        if tgt_in is not None:
            return {"logits": self.decode(tgt_in, memory, src_pad_mask)}
        return {"pred_tokens": self.greedy(memory, src_pad_mask)}

    def greedy(self, memory, src_pad_mask):
        """Up to ``max_decode_len`` tokens per row, without the BOS; PAD after a row's EOS."""
        rows = memory.shape[0]
        tokens = torch.full((rows, 1), BOS_ID, dtype=torch.long, device=memory.device)
        done = torch.zeros(rows, dtype=torch.bool, device=memory.device)
        for _ in range(self.max_decode_len):
            step = self.decode(tokens, memory, src_pad_mask)[:, -1].argmax(dim=-1)
            step = step.masked_fill(done, PAD_ID)
            tokens = torch.cat([tokens, step[:, None]], dim=1)
            done |= step == EOS_ID
            if bool(done.all()):
                break
        return tokens[:, 1:]
