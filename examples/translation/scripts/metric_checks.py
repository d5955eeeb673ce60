"""Checks for the edit-distance metric and the collate; no training or checkpoint needed.

Run from the repository root::

    python -m examples.translation.scripts.metric_checks

The last checks start a 2-rank gloo world on this machine. Exits 0 only when every check passed.
"""

import json
import socket
import sys
import tempfile
from pathlib import Path

import ignite.distributed as idist
import torch

from examples.translation.dataloaders.data_utils.vocab import EOS_ID, PAD_ID
from examples.translation.metrics.edit_distance import (
    EditDistance,
    _strip,
    edit_distance,
    get_metric,
)
from gatle_ignite import ConfigError
from gatle_ignite.data.helpers import ExactDistributedSampler, get_dataset

DS_NAME = "examples.translation.dataloaders.translation_dataset"
VALID = {"in_dim": 32, "task_seed": 1234, "num_workers": 0, "n": 256, "seed": 7, "bs": 128}
BATCH_KEYS = ["src_feats", "src_pad_mask", "tgt_in", "tgt_out"]
# One exact match and one substitution, three reference tokens each: rate 1/6, exact 1/2.
HALF_EXACT_HYPS = [[1, 2, 3], [4, 5, 7]]
HALF_EXACT_REFS = [[1, 2, 3], [4, 5, 6]]
TOLERANCE = 1e-9


class Report:
    """Collects PASS / FAIL lines and prints the tally."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, observed):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {observed}")

    def finish(self):
        print(f"\n{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def score(mode, hyps, refs, pad_id=0, eos_id=None):
    metric = EditDistance(mode, pad_id=pad_id, eos_id=eos_id)
    metric.update((hyps, refs))
    return metric.compute()


def close(value, expected):
    return abs(value - expected) < TOLERANCE


def error_of(action):
    """The message ``action`` raised with, or None when it raised nothing."""
    try:
        action()
    except Exception as error:  # any exception is an outcome to report, not a crash
        return f"{type(error).__name__}: {error}"
    return None


def check_distances(report):
    cases = [
        ("insertion", [1, 2, 4, 3], [1, 2, 3], 1),
        ("deletion", [1, 3], [1, 2, 3], 1),
        ("empty hypothesis", [], [1, 2, 3], 3),
        ("empty reference", [1, 2], [], 2),
        ("both empty", [], [], 0),
        ("reversal", [1, 2, 3, 4], [4, 3, 2, 1], 4),
    ]
    for name, hyp, ref, expected in cases:
        got = edit_distance(hyp, ref)
        report.check(f"edit_distance, {name} == {expected}", got == expected, got)


def check_rates(report):
    refs = torch.tensor([[3, 4, 5, EOS_ID], [6, 7, EOS_ID, PAD_ID]])
    perfect = score("rate", refs.clone(), refs, eos_id=EOS_ID)
    report.check("a perfect decode scores 0", perfect == 0.0, perfect)

    single = score("rate", [[1, 2, 4]], [[1, 2, 3]])
    report.check("rate is distance / reference length (1/3)", close(single, 1 / 3), single)

    # One wrong 1-token sentence and one right 9-token one: per-sentence rates average 0.5.
    hyps, long_refs = [[5], list(range(3, 12))], [[4], list(range(3, 12))]
    corpus = score("rate", hyps, long_refs)
    report.check(
        "rate is a corpus rate (0.1), not a mean of sentence rates", close(corpus, 0.1), corpus
    )

    rate = score("rate", HALF_EXACT_HYPS, HALF_EXACT_REFS)
    for mode in ("wer", "cer"):
        value = score(mode, HALF_EXACT_HYPS, HALF_EXACT_REFS)
        report.check(f"{mode} equals rate", value == rate, f"{value} vs {rate}")
    exact = score("exact", HALF_EXACT_HYPS, HALF_EXACT_REFS)
    report.check(
        "exact (0.5) differs from the rate (1/6) on the same pairs",
        close(exact, 0.5) and close(rate, 1 / 6),
        f"exact {exact}, rate {rate}",
    )

    as_tensors = score("rate", torch.tensor(HALF_EXACT_HYPS), torch.tensor(HALF_EXACT_REFS))
    report.check("tensors and plain lists score the same", as_tensors == rate, as_tensors)


def check_pad_and_eos(report):
    stripped = _strip([0, 5, 0, 6, 9, 7, 7], pad_id=0, eos_id=9)
    report.check("_strip skips PAD and stops at EOS (pad 0, eos 9)", stripped == [5, 6], stripped)
    hyps, refs = [[5, 0, 6, 9, 7, 7]], [[5, 6, 9, 0, 0, 0]]
    truncated = score("rate", hyps, refs, pad_id=0, eos_id=9)
    untruncated = score("rate", hyps, refs, pad_id=0, eos_id=None)
    report.check(
        "tokens after EOS are not scored",
        truncated == 0.0 and untruncated > 0.0,
        f"with eos {truncated}, without {untruncated:.4f}",
    )


def check_refusals(report):
    empty = error_of(lambda: score("rate", [[1, 2]], [[0, 0]]))
    report.check(
        "all-empty references raise instead of scoring perfect",
        empty is not None and "every reference is empty" in empty,
        empty,
    )
    nothing = error_of(EditDistance("rate").compute)
    report.check(
        "no examples raise", nothing is not None and "at least one example" in nothing, nothing
    )
    bad = None
    try:
        get_metric("valid", {}, mode="bleu")
    except ConfigError as error:
        bad = str(error)
    report.check(
        "a bad mode is a ConfigError", bad is not None and "mode must be one of" in bad, bad
    )


def check_info(report):
    info = {"length": 2, "pad_id": 7, "eos_id": 8}
    from_info = get_metric("valid", info)
    report.check(
        "pad/eos come from info",
        (from_info.pad_id, from_info.eos_id) == (7, 8),
        (from_info.pad_id, from_info.eos_id),
    )
    explicit = get_metric("valid", info, pad_id=0, eos_id=9)
    report.check(
        "an explicit pad/eos beats info",
        (explicit.pad_id, explicit.eos_id) == (0, 9),
        (explicit.pad_id, explicit.eos_id),
    )


def check_collate(report):
    loader, info = get_dataset(DS_NAME, VALID, field="valid_ds_name")
    batch = next(iter(loader))
    shapes = {k: tuple(v.shape) for k, v in batch.items()}
    pads_masked = bool((batch["src_feats"][batch["src_pad_mask"]] == 0).all())
    report.check(
        "the collate pads a dict batch (normal path)",
        sorted(batch) == sorted(BATCH_KEYS) and pads_masked and info["pad_id"] == PAD_ID,
        shapes,
    )


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_worker(local_rank, out_dir):
    """One rank: score its half of the pairs, and load its exact shard of the valid split."""
    rank = idist.get_rank()
    metric = EditDistance("rate")
    metric.update(([HALF_EXACT_HYPS[rank]], [HALF_EXACT_REFS[rank]]))
    value = metric.compute()

    loader, _ = get_dataset(DS_NAME, {**VALID, "exact_sharding": True}, field="valid_ds_name")
    batches = list(loader)
    result = {
        "rate": value,
        "exact_sampler": isinstance(loader.sampler, ExactDistributedSampler),
        "keys_ok": all(sorted(b) == sorted(BATCH_KEYS) for b in batches),
        "samples": sum(len(b["tgt_out"]) for b in batches),
    }
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))


def check_two_ranks(report):
    with tempfile.TemporaryDirectory() as out_dir:
        with idist.Parallel(
            backend="gloo", nproc_per_node=2, master_addr="127.0.0.1", master_port=free_port()
        ) as parallel:
            parallel.run(rank_worker, out_dir)
        results = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in (0, 1)]
    rates = [r["rate"] for r in results]
    report.check(
        "2-rank gloo: both ranks report the same rate (1/6)",
        all(close(rate, 1 / 6) for rate in rates),
        rates,
    )
    samples = [r["samples"] for r in results]
    report.check(
        "2-rank gloo: the collate works on the exact-sharded path",
        all(r["exact_sampler"] and r["keys_ok"] for r in results) and sum(samples) == VALID["n"],
        f"samples per rank {samples}",
    )


def main():
    report = Report()
    check_distances(report)
    check_rates(report)
    check_pad_and_eos(report)
    check_refusals(report)
    check_info(report)
    check_collate(report)
    check_two_ranks(report)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
