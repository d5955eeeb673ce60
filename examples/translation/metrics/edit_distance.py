"""Scores of decoded token sequences: a corpus edit-distance rate (WER/CER) or exact match."""

import torch
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from gatle_ignite import ConfigError, get_value

MODES = ("rate", "wer", "cer", "exact")


def edit_distance(hyp, ref):
    """The Levenshtein distance: insertions, deletions and substitutions each cost 1."""
    previous = list(range(len(ref) + 1))
    for i, h in enumerate(hyp, 1):
        current = [i]
        for j, r in enumerate(ref, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (h != r)))
        previous = current
    return previous[-1]


def _strip(seq, pad_id, eos_id):
    """The tokens before the first EOS, with PAD skipped."""
    kept = []
    for token in seq:
        if eos_id is not None and token == eos_id:
            break
        if token != pad_id:
            kept.append(token)
    return kept


def _rows(batch):
    """A batch of sequences (a 2-d tensor, or a list of tensors or lists) as lists of ints."""
    if torch.is_tensor(batch):
        return batch.tolist()
    return [row.tolist() if torch.is_tensor(row) else [int(t) for t in row] for row in batch]


class EditDistance(Metric):
    """``rate``/``wer``/``cer``: total distance over total reference length; ``exact``: the
    fraction of exact matches.

    The rate is a corpus rate, so long sentences weigh more than in a mean of per-sentence
    rates. The state is four counters, summed across ranks.
    """

    def __init__(self, mode="rate", pad_id=0, eos_id=None, output_transform=lambda x: x):
        if mode not in MODES:
            raise ConfigError(f"EditDistance mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.pad_id = pad_id
        self.eos_id = eos_id
        super().__init__(output_transform=output_transform)

    @reinit__is_reduced
    def reset(self):
        self._distance = torch.tensor(0, dtype=torch.long, device=self._device)
        self._ref_len = torch.tensor(0, dtype=torch.long, device=self._device)
        self._exact = torch.tensor(0, dtype=torch.long, device=self._device)
        self._count = torch.tensor(0, dtype=torch.long, device=self._device)

    @reinit__is_reduced
    def update(self, output):
        hyps, refs = (_rows(part) for part in output)
        if len(hyps) != len(refs):
            raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
        distance = ref_len = exact = 0
        for hyp, ref in zip(hyps, refs):
            hyp = _strip(hyp, self.pad_id, self.eos_id)
            ref = _strip(ref, self.pad_id, self.eos_id)
            distance += edit_distance(hyp, ref)
            ref_len += len(ref)
            exact += hyp == ref
        self._distance += distance
        self._ref_len += ref_len
        self._exact += exact
        self._count += len(refs)

    @sync_all_reduce("_distance", "_ref_len", "_exact", "_count")
    def compute(self):
        if self._count.item() == 0:
            raise NotComputableError("EditDistance needs at least one example before compute()")
        if self.mode == "exact":
            return self._exact.item() / self._count.item()
        if self._ref_len.item() == 0:
            # 0 / 0 would otherwise read as a perfect score.
            raise NotComputableError(
                "every reference is empty, so the edit-distance rate is undefined; check that "
                "the targets are not all PAD and that eos_id does not cut them to nothing"
            )
        return self._distance.item() / self._ref_len.item()


def get_metric(
    engine_type,
    info,
    src_name="pred_tokens",
    tgt_name=("targets", "tokens"),
    mode="rate",
    pad_id=None,
    eos_id=None,
):
    """An ``EditDistance`` over ``y_pred[src_name]`` against ``target[tgt_name]``.

    PAD and EOS ids come from the split's ``info`` unless given explicitly.
    """
    pad_id = info.get("pad_id", 0) if pad_id is None else pad_id
    eos_id = info.get("eos_id") if eos_id is None else eos_id

    def output_transform(output):
        return get_value(output["y_pred"], src_name), get_value(output["target"], tgt_name)

    return EditDistance(mode, pad_id=pad_id, eos_id=eos_id, output_transform=output_transform)
