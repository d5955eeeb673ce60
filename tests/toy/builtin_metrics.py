"""Every built-in metric over one fixed split, as an evaluator computes it: on one process, or
on 2 gloo ranks that each hold an exact, uneven shard (127 samples: 64 and 63).

    python -m tests.toy.builtin_metrics PORT [padded]   # rank 0 prints the values as JSON

``padded`` shards with a padding DistributedSampler instead (a repeated sample is scored): the
negative control, which must change a value.
"""

import json
import sys

import ignite.distributed as idist
import torch
from ignite.engine import Engine
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader
from gatle_ignite.dispatch import import_entrypoint

N, T, V, C = 127, 5, 7, 4
IGNORE = -100

# name -> (module under gatle_ignite.metrics, params)
METRICS = {
    "acc": ("accuracy", {"src_name": "cls", "tgt_name": "cls_labels"}),
    "seq_acc": ("accuracy", {"src_name": "seq", "tgt_name": "tokens", "ignore_index": IGNORE}),
    "top2": ("top_k_accuracy", {"src_name": "cls", "tgt_name": "cls_labels", "k": 2}),
    "precision": ("precision", {"src_name": "cls", "tgt_name": "cls_labels"}),
    "recall": ("recall", {"src_name": "cls", "tgt_name": "cls_labels"}),
    "f1": ("f1", {"src_name": "cls", "tgt_name": "cls_labels"}),
    "bin_acc": ("accuracy", {"src_name": "bin", "tgt_name": "bin_labels"}),
    "bin_f1": ("f1", {"src_name": "bin", "tgt_name": "bin_labels", "average": "binary"}),
    "bin_precision": (
        "precision",
        {"src_name": "bin", "tgt_name": "bin_labels", "average": "binary"},
    ),
    "bin_recall": ("recall", {"src_name": "bin", "tgt_name": "bin_labels", "average": "binary"}),
    "perplexity": ("perplexity", {"src_name": "seq", "tgt_name": "tokens"}),
    "mae": ("mae", {"src_name": "reg", "tgt_name": "reg_targets"}),
    "mse": ("mse", {"src_name": "reg", "tgt_name": "reg_targets"}),
    "loss": ("loss", {"src_name": "cls", "tgt_name": "cls_labels"}),
}


def split() -> dict:
    """The split's tensors: sequence logits with padded targets, class scores, binary scores,
    regression outputs; from a fixed generator."""
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, V, (N, T), generator=gen)
    lengths = torch.randint(1, T + 1, (N,), generator=gen)
    tokens[torch.arange(T) >= lengths[:, None]] = IGNORE
    return {
        "seq": torch.randn(N, T, V, generator=gen),
        "tokens": tokens,
        "cls": torch.randn(N, C, generator=gen),
        "cls_labels": torch.randint(0, C, (N,), generator=gen),
        "bin": torch.randn(N, generator=gen),
        "bin_labels": torch.randint(0, 2, (N,), generator=gen),
        "reg": torch.randn(N, 3, generator=gen),
        "reg_targets": torch.randn(N, 3, generator=gen),
    }


_OUTPUTS = ("seq", "cls", "bin", "reg")


def evaluate(bs: int = 16, exact: bool = True) -> dict:
    """Every metric of ``METRICS`` over the split, on however many ranks are running."""
    data = split()
    names = list(data)
    loader = build_dataloader(
        TensorDataset(*data.values()), {"bs": bs, "exact_sharding": exact, "shuffle": False}
    )

    def step(_engine, batch):
        values = dict(zip(names, batch))
        outputs = {k: values[k] for k in _OUTPUTS}
        targets = {k: v for k, v in values.items() if k not in _OUTPUTS}
        return {"y_pred": outputs, "target": {"model_input": {}, "targets": targets}}

    engine = Engine(step)
    for name, (module, params) in METRICS.items():
        get_metric = import_entrypoint(f"gatle_ignite.metrics.{module}", "get_metric")
        get_metric("valid", {}, **params).attach(engine, name)
    engine.run(loader, max_epochs=1)
    return {name: float(engine.state.metrics[name]) for name in METRICS}


def _report(_local_rank, exact):
    values = evaluate(exact=exact)
    if idist.get_rank() == 0:
        print(json.dumps(values), flush=True)


if __name__ == "__main__":
    with idist.Parallel(
        backend="gloo", nproc_per_node=2, master_addr="127.0.0.1", master_port=int(sys.argv[1])
    ) as parallel:
        parallel.run(_report, sys.argv[2:] != ["padded"])
