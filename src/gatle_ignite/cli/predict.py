"""``gatle-ignite predict``: the model's outputs for every sample of a split, in dataset order.

Every rank runs its contiguous block of the split (ExactDistributedSampler), rank 0 gathers
the blocks in rank order and writes one file with ``torch.save``: ``{key: tensor[N, ...]}``,
keyed like the model's output. Nested outputs are flattened to dotted keys (``{"heads":
{"a": t}}`` becomes ``"heads.a"``, a list's items ``"name.0"``); a bare tensor is ``"y_pred"``.
With ``with_targets``, ``prep_batch``'s ``targets`` are written beside them as ``targets.<key>``,
and each row's sample index in the dataset as ``index``.
"""

import dataclasses
import os
from functools import partial
from pathlib import Path
from typing import Optional, Union

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ml_collections import config_dict
from torch.utils.data import SequentialSampler

from gatle_ignite.data.helpers import ExactDistributedSampler
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.trainer.checkpointing import load_eval_checkpoint
from gatle_ignite.utils.batch import named_outputs

__all__ = ["INDEX_KEY", "TARGETS_KEY", "flatten_output", "predict"]

# The keys --with-targets adds beside the model's outputs.
INDEX_KEY = "index"
TARGETS_KEY = "targets"


def predict(
    cfg: config_dict.ConfigDict,
    split: str,
    out: Union[str, os.PathLike],
    ckpt: str = "best",
    with_targets: bool = False,
) -> None:
    """Load ``ckpt`` in inference mode and write the ``split``'s outputs to ``out``; with
    ``with_targets`` also the targets and the sample indices.

    Launched like ``gatle-ignite eval``, so ``nproc_per_node`` and torchrun work the same.
    """
    from gatle_ignite.launch import launcher

    _check_split_has_data(cfg, split)
    cfg.run = True
    cfg.load_from_ckpt = ckpt
    job = partial(_predict_on_rank, split=split, out=Path(out), with_targets=with_targets)
    launcher.launch(cfg, job=job)


def _eval_splits_with_data(cfg) -> list:
    return [
        key[: -len("_ds_name")]
        for key in cfg.keys()
        if key.endswith("_ds_name") and key != "train_ds_name" and cfg[key]
    ]


def _check_split_has_data(cfg, split: str) -> None:
    """Refuse, before any process starts, a split the config gives no data."""
    if split == "train":
        raise ConfigError(
            "predict runs an evaluation split; the train loader shuffles and pads its shards.\n"
            "  To predict the training data, name it as an evaluation split too (e.g. "
            "test_ds_name and test_ds_params) and pass --split test."
        )
    if not cfg.get(f"{split}_ds_name", None):
        found = ", ".join(_eval_splits_with_data(cfg)) or "none"
        raise ConfigError(
            f"split {split!r} has no data: {split}_ds_name is not set.\n"
            f"  The evaluation splits with data: {found}."
        )


def _predict_on_rank(trainer, split: str, out: Path, with_targets: bool = False) -> None:
    """One rank's part: predict its block, then rank 0 gathers every block and writes."""
    trainer.setup()
    load_eval_checkpoint(trainer)
    spec = _spec_for(trainer, split)
    loader = trainer.dls.get(spec.split)
    if loader is None:
        raise ConfigError(f"split {split!r} has no data: its loader was not built.")
    _check_in_dataset_order(loader, split)
    left_out = {}
    block = _predict_block(trainer, spec, loader, with_targets, left_out)
    blocks = _gather_on_rank_zero(block)
    if idist.get_rank() == 0:
        predictions = _join_blocks(blocks, split)
        _check_one_row_per_sample(predictions, loader, split)
        _write(predictions, out)
        _report(predictions, split, out, left_out)


def _spec_for(trainer, split: str):
    """The first engine declared on ``split``: with an EMA's raw twin, the EMA evaluator."""
    specs = trainer.eval_specs()
    for spec in specs:
        if spec.split == split:
            return spec
    raise ConfigError(
        f"{type(trainer).__name__} declares no evaluation engine for split {split!r}; "
        f"its splits: {', '.join(spec.split for spec in specs)}."
    )


def _check_in_dataset_order(loader, split: str) -> None:
    """Only these samplers visit the samples in order, each exactly once, across the ranks."""
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, ExactDistributedSampler):
        return
    if idist.get_world_size() == 1 and isinstance(sampler, SequentialSampler):
        return
    raise ConfigError(
        f"the {split} loader's sampler ({type(sampler).__name__}) does not visit the split in "
        f"dataset order, once per sample, on {idist.get_world_size()} process(es).\n"
        f"  Build the split with gatle_ignite.build_dataloader, without shuffle or "
        f"sampler_params, so that it is sharded exactly."
    )


def _predict_block(
    trainer, spec, loader, with_targets: bool = False, left_out: Optional[dict] = None
) -> dict:
    """``{key: tensor}`` for this rank's samples, on the CPU; empty when it has none. What an
    output record holds with no row per sample goes into ``left_out``."""
    batches = []
    # A fresh engine: the trainer's own evaluator would also compute its metrics and stop at
    # the split's *_length, and predict wants every sample and only the outputs.
    engine = Engine(partial(getattr(trainer, spec.step), split=spec.engine_type))

    @engine.on(Events.ITERATION_COMPLETED)
    def _keep(_engine):
        output = engine.state.output
        rows = flatten_output(output["y_pred"], left_out=left_out)
        if with_targets:
            rows = _with_targets(rows, output.get("target"))
        batches.append(rows)

    if len(loader) > 0:
        with trainer.eval_context(spec):
            engine.run(loader, max_epochs=1)
    if not batches:
        return {}
    block = {key: torch.cat([batch[key] for batch in batches]) for key in batches[0]}
    if with_targets:
        # The samplers _check_in_dataset_order admits visit their indices in order, once each.
        block[INDEX_KEY] = torch.tensor(list(loader.sampler), dtype=torch.long)
    return block


def _with_targets(rows: dict, prepared) -> dict:
    """``rows`` and the batch's targets under ``targets.<key>``; no output may take the names."""
    if not isinstance(prepared, dict) or "targets" not in prepared:
        raise ConfigError(
            "--with-targets writes prep_batch's 'targets', and the eval step's output has none "
            "(output['target']['targets'])."
        )
    clashes = [key for key in rows if key == INDEX_KEY or key.startswith(f"{TARGETS_KEY}.")]
    if clashes:
        raise ConfigError(
            f"the model's output keys {clashes} are the names --with-targets writes; rename "
            f"them in the model, or predict without --with-targets."
        )
    return {**rows, **flatten_output(prepared["targets"], TARGETS_KEY)}


def flatten_output(y_pred, prefix: str = "", left_out: Optional[dict] = None) -> dict:
    """``{dotted key: tensor on the CPU}`` from a model output of nested dicts and lists.

    A library's output record (a dataclass, such as a ``transformers`` ``ModelOutput``) is
    written as it is, less what has no row per sample: a field that is None, a scalar (the
    batch's loss) or another object (a key-value cache), each named in ``left_out``.
    """
    if torch.is_tensor(y_pred):
        key = prefix or "y_pred"
        if y_pred.dim() == 0:
            raise ConfigError(
                f"model output {key!r} is a scalar; predict writes tensors with one row per sample."
            )
        return {key: y_pred.detach().cpu()}
    items = _items(y_pred)
    if items is None:
        raise ConfigError(
            f"model output {prefix or 'y_pred'!r} is a {type(y_pred).__name__}; predict writes "
            f"tensors (in dicts, lists or tuples) with one row per sample."
        )
    record = dataclasses.is_dataclass(y_pred)
    flat = {}
    for name, value in items:
        key = f"{prefix}.{name}" if prefix else str(name)
        if record and _no_rows(value):
            if left_out is not None and value is not None:
                left_out[key] = _what(value)
            continue
        flat.update(flatten_output(value, key, left_out))
    return flat


def _items(value):
    named = named_outputs(value)
    if named is not None:
        return named.items()
    if isinstance(value, (list, tuple)):
        return enumerate(value)
    return None


def _no_rows(value) -> bool:
    if torch.is_tensor(value):
        return value.dim() == 0
    return _items(value) is None


def _what(value) -> str:
    if torch.is_tensor(value):
        return "one value per batch"
    return f"a {type(value).__name__}"


def _gather_on_rank_zero(block: dict) -> list:
    if idist.get_world_size() == 1:
        return [block]
    blocks = [None] * idist.get_world_size() if idist.get_rank() == 0 else None
    torch.distributed.gather_object(block, blocks, dst=0)
    return blocks


def _join_blocks(blocks: list, split: str) -> dict:
    """The ranks' blocks, concatenated in rank order: the dataset's order."""
    filled = [block for block in blocks if block]
    if not filled:
        raise ConfigError(f"split {split!r} has no samples: its loader yielded no batch.")
    return {key: torch.cat([block[key] for block in filled]) for key in filled[0]}


def _check_one_row_per_sample(predictions: dict, loader, split: str) -> None:
    # The samplers _check_in_dataset_order lets through only take datasets with a length.
    expected = len(loader.dataset)
    for key, tensor in predictions.items():
        if len(tensor) != expected:
            raise ConfigError(
                f"model output {key!r} has {len(tensor)} rows for the {expected} samples of the "
                f"{split} split; predict needs one row per sample (drop_last=False)."
            )


def _write(predictions: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside and renamed, so a crash never leaves a truncated file under the name.
    partial_file = out.with_name(out.name + ".partial")
    torch.save(predictions, partial_file)
    os.replace(partial_file, out)


def _report(predictions: dict, split: str, out: Path, left_out: Optional[dict] = None) -> None:
    count = len(next(iter(predictions.values())))
    print(f"PREDICTIONS: {count} samples of the {split} split written to {out}")
    for key, tensor in predictions.items():
        print(f"  {key}: {list(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}")
    for key, what in (left_out or {}).items():
        print(f"  {key}: left out, {what}")
