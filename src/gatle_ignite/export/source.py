"""What is exported: the task's model, loaded as ``gatle-ignite eval`` loads it, holding the
weights evaluation saw, and one real batch of an evaluation split to trace and check it with;
a few more batches of that split show which input dimensions vary in use.

The trainer is built in inference mode in this one process, whatever ``nproc_per_node`` says,
with ``compile`` and activation checkpointing off (they change how the model runs, not what it
computes). The model is exported in float32 on the CPU: autocast is not part of it.
"""

import itertools
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Union

import torch

from gatle_ignite.dispatch import ConfigError, import_entrypoint
from gatle_ignite.export.shapes import named_dims, varying_dims
from gatle_ignite.export.verify import rows_of
from gatle_ignite.trainer.base import BaseTrainer
from gatle_ignite.trainer.checkpointing import load_eval_checkpoint
from gatle_ignite.trainer.checks import check_prepared
from gatle_ignite.utils.batch import to_device

__all__ = ["Source", "load_source"]

_CPU = torch.device("cpu")
# Batches taken through prep_batch to see which input dimensions vary: enough to catch a
# per-batch padded length, few enough to cost nothing beside the export.
SAMPLED_BATCHES = 8


@dataclass
class Source:
    """The model to export (CPU, eval mode, the chosen weights) and its example inputs."""

    model: torch.nn.Module
    inputs: dict
    checkpoint: Union[Path, str]
    # "eval" or "raw": which weights the model holds.
    weights: str
    # Whether the task's eval_context swaps other weights in (an EMA).
    swapped: bool
    split: str
    # {key: {dim}}: the dimensions whose size differs between the sampled batches.
    varying: dict = field(default_factory=dict)
    # {key: [(dim, who named it)]}: those export_params or --dynamic name.
    named: dict = field(default_factory=dict)

    @property
    def rows(self):
        return rows_of(self.inputs)


def load_source(cfg, ckpt: str, weights: str, dynamic=()) -> Source:
    """Build the config's trainer, load ``ckpt`` into it, and take a few batches of its first
    evaluation split with data through ``prep_batch``; ``dynamic`` holds ``--dynamic``'s
    ``(key, [dim])`` pairs."""
    cfg.run = True
    cfg.load_from_ckpt = ckpt
    cfg.compile = False
    cfg.activation_checkpointing = []
    Trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    trainer = Trainer(0, cfg).setup()
    # A Path, or on object storage the checkpoint's URL.
    checkpoint = load_eval_checkpoint(trainer)
    name = PurePosixPath(str(checkpoint)).name
    if name.endswith(".dcp"):
        print(f"CONSOLIDATED: the shards of {name} loaded as one whole model")
    spec = _example_spec(trainer)
    batches = _sampled_inputs(trainer, spec)
    swapped = _choose_weights(trainer, spec, weights)
    model = trainer.model.to(_CPU).eval()
    _note_own_forward(trainer)
    named = named_dims(cfg.get("export_params", None), dynamic)
    return Source(
        model,
        batches[0],
        checkpoint,
        weights,
        swapped,
        spec.split,
        varying=varying_dims(batches),
        named=named,
    )


def _example_spec(trainer):
    """The first evaluation engine whose split has data: the one that scores the run."""
    for spec in trainer.eval_specs():
        if trainer.dls.get(spec.split) is not None:
            return spec
    raise ConfigError(
        "export takes its example batch from an evaluation split, and no split has data.\n"
        "  Set valid_ds_name and valid_ds_params in the config."
    )


def _sampled_inputs(trainer, spec) -> list:
    """The model inputs of the split's first batches: the first is the example."""
    loader = trainer.dls[spec.split]
    batches = list(itertools.islice(loader, SAMPLED_BATCHES))
    if not batches:
        raise ConfigError(f"the {spec.split} split yielded no batch to export with.")
    return [_model_input(trainer, spec, batch) for batch in batches]


def _model_input(trainer, spec, batch) -> dict:
    prepared = trainer.prep_batch(batch, split=spec.engine_type)
    check_prepared(prepared, spec.engine_type)
    inputs = to_device(dict(prepared["model_input"]), _CPU)
    if rows_of(inputs) is None:
        raise ConfigError(
            f'prep_batch(batch, split="{spec.engine_type}") gave a model_input without a '
            f"tensor ({sorted(inputs)}); export traces the model on tensors."
        )
    return inputs


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}


def _choose_weights(trainer, spec, weights: str) -> bool:
    """Leave the model holding the ``weights`` asked for; returns whether eval_context swaps
    other weights in, and says which weights are exported."""
    model = trainer.model
    raw = _state(model)
    with trainer.eval_context(spec):
        evaluated = _state(model)
    swapped = any(not torch.equal(raw[key], evaluated[key]) for key in raw)
    name = type(trainer).__name__
    if not swapped:
        print(
            f"WEIGHTS: the checkpoint's model weights ({name}.eval_context changes none of them, "
            f"so raw and eval are the same)"
        )
        return False
    if weights == "eval":
        model.load_state_dict(evaluated, strict=False)
        print(
            f"WEIGHTS: eval, those the {spec.engine_type} evaluation saw ({name}.eval_context "
            f"swaps them in, e.g. an EMA); --weights raw exports the trained weights instead"
        )
    else:
        model.load_state_dict(raw, strict=False)
        print(
            f"WEIGHTS: raw, the trained weights; the {spec.engine_type} evaluation sees others "
            f"({name}.eval_context swaps them in): --weights eval exports those"
        )
    return True


def _note_own_forward(trainer) -> None:
    if type(trainer).forward is not BaseTrainer.forward:
        print(
            f"NOTE: {type(trainer).__name__} overrides forward(); the export is of the model "
            f"alone, called as model(**model_input)"
        )
