"""Mistakes caught before they cost an epoch, each a config error naming the fix.

A ``prep_batch`` that returns the wrong thing, a model whose ``forward`` refuses the
``model_input`` keys or returns no dict, a ``score_name`` no engine produces, a split with no
batches.
"""

import difflib
import inspect
from collections.abc import Mapping
from typing import Optional

import torch

from gatle_ignite.dispatch import ConfigError, ParamsError
from gatle_ignite.utils.batch import named_outputs

__all__ = [
    "check_not_empty",
    "check_prepared",
    "check_scores",
    "explain_forward_error",
    "explain_output_error",
    "score_refusal",
]

# How alike a score name and a metric's must be for the metric to be suggested.
_NEAR_NAME = 0.6


def _shape_of(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {list(value.shape)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {sorted(map(str, value))}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    return f"a {type(value).__name__}"


def check_prepared(prepared, split: str) -> None:
    """Refuse what ``prep_batch`` returned unless it is a dict with a ``model_input`` dict."""
    if isinstance(prepared, Mapping) and isinstance(prepared.get("model_input"), Mapping):
        return
    raise ConfigError(
        f'prep_batch(batch, split="{split}") returned {_shape_of(prepared)}, but it must return '
        f'a dict holding "model_input", the dict of the model\'s keyword arguments, beside what '
        f"the loss and metrics read, e.g.\n"
        f'    return {{"model_input": {{"x": x}}, "targets": {{"labels": y}}}}\n'
        f"  Fix prep_batch in your Trainer (cfg.main_runner)."
    )


def explain_forward_error(model, model_input: Mapping):
    """The error to raise when the model refuses the ``model_input`` keys, else None.

    Called after forward raised a TypeError: only a mismatch of keys and arguments is
    explained; a TypeError from inside the model keeps its own traceback.
    """
    forward = getattr(getattr(model, "module", model), "forward", None)
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**model_input)
    except TypeError as refused:
        return ParamsError(
            f"the model's forward{signature} does not accept the model_input keys "
            f"{sorted(model_input)} that prep_batch returned ({refused}).\n"
            f"  Make prep_batch's model_input keys match forward's arguments, or the other way "
            f"round."
        )
    return None


def explain_output_error(y_pred):
    """The error to raise when the loss failed on a model output that has no names (neither a
    mapping nor a dataclass), else None.

    Called after the loss raised an IndexError, KeyError or TypeError: reading a name from a
    Tensor raises one of them.
    """
    if named_outputs(y_pred) is not None:
        return None
    return ConfigError(
        f"the loss could not read the model's output: forward returned {_shape_of(y_pred)}, "
        f"but it must return a dict of named outputs, e.g.\n"
        f'    return {{"logits": self.head(features)}}\n'
        f"  Losses and metrics read the outputs by name (src_name)."
    )


def check_scores(cfg, specs, metric_names: dict) -> None:
    """Refuse a score field naming a metric its engine does not produce.

    ``metric_names`` maps a built engine's key to the names attached to it; an engine that was
    not built (no data, a cadence of 0) is already warned about by the config checks.
    """
    for spec in specs:
        score_name = cfg.get(spec.score_field, None) if spec.score_field else None
        names = metric_names.get(spec.key)
        if not isinstance(score_name, str) or not score_name or names is None:
            continue
        refusal = score_refusal(spec, score_name, names)
        if refusal is not None:
            raise ConfigError(refusal)


def score_refusal(spec, score_name: str, names) -> Optional[str]:
    """What is wrong with ``score_name`` when ``spec``'s engine produces only ``names``."""
    if score_name in names:
        return None
    meant = difflib.get_close_matches(score_name, sorted(names), n=1, cutoff=_NEAR_NAME)
    hint = f" Did you mean {meant[0]!r}?" if meant else ""
    return (
        f"cfg.{spec.score_field} = {score_name!r}, but the '{spec.key}' engine produces "
        f"{sorted(names)}.{hint}\n"
        f"  Name one of those, or add the metric to cfg.{spec.metrics_field}."
    )


def check_not_empty(split: str, loader) -> None:
    """Refuse a split with nothing to run, which would otherwise only fail after an epoch.

    The training split must yield a batch on this rank; an evaluation split must hold a
    sample (one rank's exact shard of a tiny split may be empty, and that is fine).
    """
    dataset = getattr(loader, "dataset", None)
    try:
        empty = len(loader) == 0 if split == "train" else len(dataset) == 0
    except TypeError:
        return  # an iterable dataset: its length is unknown
    if empty:
        raise ConfigError(
            f"the {split} split yields no batch: {len(dataset)} sample(s), batch size "
            f"{getattr(loader, 'batch_size', '?')}, drop_last={getattr(loader, 'drop_last', '?')}."
            f"\n  Give it data, a smaller bs, or drop_last=False in cfg.{split}_ds_params."
        )
