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
    "note_library_error",
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


def _forward_of(model):
    """The forward the model's own code defines: under a DDP wrap (``module``) and a compiled
    module (``_orig_mod``), whose own forwards take anything."""
    for attribute in ("module", "_orig_mod", "module"):
        model = getattr(model, attribute, model)
    return getattr(model, "forward", None), model


def _where_defined(function) -> str:
    try:
        return f" ({inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]})"
    except (OSError, TypeError):
        return ""


def explain_forward_error(model, model_input: Mapping, error=None, prep_batch=None):
    """The error to raise when the model's forward failed on a ``model_input`` key it does not
    take, else None.

    Called after forward raised ``error``. A key its signature refuses, or one a pass-through
    (a compiled model, a ``**kwargs`` wrapper) reports as an unexpected keyword, is explained
    with ``prep_batch``'s keys, where ``prep_batch`` is, and forward's parameters. A key a
    ``**kwargs`` forward takes unnamed may or may not be the cause (a ``transformers`` model
    then fails on the input it missed; another error may be its own): ``error`` keeps its
    traceback and gets a note saying so.
    """
    forward, inner = _forward_of(model)
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return None
    parameters = signature.parameters.values()
    named = [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    unnamed = [key for key in model_input if key not in named]
    try:
        signature.bind(**model_input)
        why = None
    except TypeError as refusal:
        why = refusal
    unexpected = isinstance(error, TypeError) and any(
        f"unexpected keyword argument '{key}'" in str(error) for key in unnamed
    )
    if why is None and unexpected:
        why = _first_line(error)
    if why is None and not unnamed:
        return None
    where = _where_defined(prep_batch) if prep_batch is not None else ""
    keys = f"the model_input keys {sorted(model_input)} that prep_batch{where} returned"
    names = f"{type(inner).__module__}.{type(inner).__qualname__}.forward names {named}"
    if why is None:
        from gatle_ignite.utils.frames import add_note

        add_note(error, f"Of {keys}, {names}; not {unnamed}, which its **kwargs took.")
        return None
    return ParamsError(
        f"the model's forward{signature} does not accept {keys} ({why}).\n"
        f"  {names}; not {unnamed}.\n"
        f"  Make prep_batch's model_input keys match forward's arguments, or the other way "
        f"round."
    )


def _first_line(error) -> str:
    return next(iter(str(error).splitlines()), "")


def note_library_error(error: Exception, cfg, model, model_input: Mapping) -> None:
    """Add to an error the model's forward raised inside a library (``timm``, ``transformers``)
    the config that built the model, the field the message likely speaks of, and the inputs."""
    from gatle_ignite.utils.frames import add_note, library_note

    built = f"in the model built from model_name = {cfg.model_name!r} and"
    params = cfg.get("model_params", None)
    note = library_note(error, "model_params", params, built, _library_config(model))
    if note is not None:
        add_note(error, f"{note}\n  model_input: {_tensor_shapes(model_input)}")


def _library_config(model) -> dict:
    """The scalar settings a library's model keeps of its own (a ``transformers`` config)."""
    _forward, inner = _forward_of(model)
    to_dict = getattr(getattr(inner, "config", None), "to_dict", None)
    if not callable(to_dict):
        return {}
    try:
        settings = to_dict()
    except Exception:
        return {}
    return {k: v for k, v in settings.items() if isinstance(v, (int, float, str))}


def _tensor_shapes(model_input: Mapping) -> str:
    return ", ".join(
        f"{key} {str(value.dtype).replace('torch.', '')}{list(value.shape)}"
        if isinstance(value, torch.Tensor)
        else f"{key} {_shape_of(value)}"
        for key, value in model_input.items()
    )


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
    # A metric's own name (acc) is meant as its full key (valid/acc).
    meant = [name for name in sorted(names) if name.partition("/")[2] == score_name]
    meant = meant or difflib.get_close_matches(score_name, sorted(names), n=1, cutoff=_NEAR_NAME)
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
