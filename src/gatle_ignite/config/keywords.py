"""The keyword arguments a config's params mappings give the components it names, checked
against the signatures that receive them, before anything is built.

Only where the receiver is known from the config alone: a component the trainer builds its
default way (the ``build_*`` method not overridden), whose entrypoint has a signature to read.
A signature with ``**kwargs`` takes any keyword and stays unchecked, except in the framework's
own built-ins, which say where their ``**kwargs`` go (``KWARGS_GO_TO``).
"""

import inspect
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from gatle_ignite.config.names import HINT_CUTOFF, TYPO_CUTOFF, closest
from gatle_ignite.data.helpers import LOADER_KEYS
from gatle_ignite.dispatch import ConfigError, import_entrypoint
from gatle_ignite.losses import composite
from gatle_ignite.metrics import loss as loss_metric

__all__ = ["keyword_problems"]

_METRIC_FIELDS = ("train_metrics", "val_metrics", "tester_metrics")
_COMPOSITE = "gatle_ignite.losses.composite"
_LOSS_METRIC = "gatle_ignite.metrics.loss"

_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True)
class _Call:
    """One call the trainer makes: ``<path>.<entrypoint>(*given, **<params field>)``."""

    params_field: str
    path_field: str
    path: str
    entrypoint: str
    params: Any
    given: tuple = ()


@dataclass
class _Keywords:
    """What a callee takes by keyword after the framework's positional arguments."""

    names: set
    required: list
    any_keyword: bool
    positional_short: bool


def _keywords(callee: Callable, given: int) -> Optional[_Keywords]:
    try:
        parameters = list(inspect.signature(callee).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in parameters if p.kind in _BY_POSITION]
    filled = positional[:given]
    rest = [p for p in parameters if p not in filled and p.kind in _BY_KEYWORD]
    takes_args = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters)
    return _Keywords(
        names={p.name for p in rest},
        required=[p.name for p in rest if p.default is inspect.Parameter.empty],
        any_keyword=any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters),
        positional_short=len(positional) < given and not takes_args,
    )


def _forwarded(callee: Callable, keywords: _Keywords) -> None:
    """Add the keywords a built-in's ``**kwargs`` reach; still any keyword when the last one
    they reach takes ``**kwargs`` too, or the built-in does not say where they go."""
    module = sys.modules.get(getattr(callee, "__module__", "") or "")
    if module is None or not module.__name__.startswith("gatle_ignite."):
        return
    for target, given_there in getattr(module, "KWARGS_GO_TO", ()):
        reached = _keywords(target, 0)
        if reached is None:
            return
        keywords.names |= reached.names - set(given_there)
        keywords.any_keyword = reached.any_keyword
        if not reached.any_keyword:
            return


def _call_problems(call: _Call) -> list:
    try:
        callee = import_entrypoint(call.path, call.entrypoint, field=call.path_field)
    except ConfigError as error:
        return [str(error)]
    keywords = _keywords(callee, len(call.given))
    if keywords is None:
        return []
    if keywords.any_keyword:
        _forwarded(callee, keywords)
    where = f"{call.path}.{call.entrypoint}"
    if keywords.positional_short:
        return [
            f"{where}{inspect.signature(callee)} must take {len(call.given)} positional "
            f"argument(s) first, {', '.join(call.given)}, which the framework passes."
        ]
    given = list(_mapping(call.params).keys())
    problems = []
    if not keywords.any_keyword:
        for key in given:
            if key not in keywords.names:
                problems.append(_unknown_keyword(call, where, key, keywords.names))
    for name in keywords.required:
        if name not in given:
            problems.append(
                f"{call.params_field} lacks {name!r}, which {where} requires (it has no "
                f"default).\n  Add {call.params_field}.{name}."
            )
    return problems


def _unknown_keyword(call: _Call, where: str, key: str, names: set) -> str:
    meant = closest(str(key), names, HINT_CUTOFF)
    hint = f" Did you mean {meant!r}?" if meant else ""
    return (
        f"{call.params_field}.{key}: {where} takes no keyword {key!r}.{hint}\n"
        f"  Its keywords: {', '.join(sorted(names)) or '(none)'}."
    )


def _mapping(value) -> Mapping:
    return value if hasattr(value, "items") else {}


def _component_calls(cfg, builds: Callable[[str], bool]) -> Iterator[_Call]:
    """The calls taking params that the trainer's default build methods make, in order."""
    if builds("build_dataloaders") and cfg.get("aug_name", None):
        yield _Call("aug_params", "aug_name", cfg.aug_name, "Transformation", cfg.get("aug_params"))
    if builds("build_model"):
        yield _Call("model_params", "model_name", cfg.model_name, "Model", cfg.get("model_params"))
    if builds("build_criterion"):
        criterion = cfg.criterion_name
        params = cfg.get("criterion_params")
        yield _Call("criterion_params", "criterion_name", criterion, "Loss", params)
        if criterion == _COMPOSITE:
            yield from _loss_entry_calls(_mapping(params).get("dict_of_loss_params", None))
    if builds("build_optimizer"):
        params = cfg.get("optimizer_params")
        yield _Call(
            "optimizer_params",
            "optimizer_name",
            cfg.optimizer_name,
            "get_optimizer",
            params,
            ("model",),
        )
    if builds("build_scheduler") and cfg.get("lr_scheduler", None):
        given = ("cfg", "train_dl", "optimizer", "engines")
        params = cfg.get("lr_scheduler_params")
        yield _Call(
            "lr_scheduler_params", "lr_scheduler", cfg.lr_scheduler, "get_scheduler", params, given
        )
    if builds("dict_metric_from_list") and builds("init_metrics"):
        for metrics_field in _METRIC_FIELDS:
            for key, entry in _mapping(cfg.get(metrics_field, None)).items():
                if hasattr(entry, "get") and entry.get("cls_name", None):
                    name = f"{metrics_field}.{key}"
                    yield _Call(
                        f"{name}.params",
                        f"{name}.cls_name",
                        entry["cls_name"],
                        "get_metric",
                        entry.get("params", None),
                        ("engine_type", "info"),
                    )
                    if entry["cls_name"] == _LOSS_METRIC:
                        yield _loss_metric_call(name, entry.get("params", None))


def _loss_entry_calls(entries) -> Iterator[_Call]:
    for key, entry in _mapping(entries).items():
        if hasattr(entry, "get") and entry.get("cls_name", None):
            name = f"criterion_params.dict_of_loss_params.{key}"
            params = entry.get("loss_params", None)
            yield _Call(
                f"{name}.loss_params", f"{name}.cls_name", entry["cls_name"], "Loss", params
            )


def _loss_metric_call(name: str, params) -> _Call:
    """The loss module the built-in loss metric builds from the rest of its params."""
    params = dict(_mapping(params))
    path = params.pop("loss_name", loss_metric.DEFAULT_LOSS)
    return _Call(f"{name}.params", f"{name}.params.loss_name", path, "Loss", params)


def _loader_calls(cfg) -> Iterator[_Call]:
    """The sampler and collate function build_dataloader makes from each split's params."""
    for name in _ds_params_fields(cfg):
        params = _mapping(cfg.get(name))
        sampler = params.get("sampler_params", None)
        if hasattr(sampler, "get") and sampler.get("cls_name", None):
            where = f"{name}.sampler_params"
            yield _Call(
                f"{where}.params",
                f"{where}.cls_name",
                sampler["cls_name"],
                "get_sampler",
                sampler.get("params", None),
                ("dataset",),
            )
        collate = params.get("collate_fn", None)
        if hasattr(collate, "get") and collate.get("cls_name", None):
            where = f"{name}.collate_fn"
            yield _Call(
                f"{where}.params",
                f"{where}.cls_name",
                collate["cls_name"],
                "get_collate_fn",
                collate.get("params", None),
            )


def _ds_params_fields(cfg) -> list:
    return sorted(name for name in cfg.keys() if str(name).endswith("_ds_params"))


def _loader_key_problems(cfg) -> Iterator[str]:
    """A key of a split's params so like a key build_dataloader reads that it must be one."""
    for name in _ds_params_fields(cfg):
        for key in _mapping(cfg.get(name)):
            meant = closest(str(key), LOADER_KEYS, TYPO_CUTOFF)
            if key not in LOADER_KEYS and meant is not None:
                yield (
                    f"{name}.{key}: did you mean {meant!r}? build_dataloader reads "
                    f"{', '.join(LOADER_KEYS)}, and never {key!r}.\n"
                    f"  A key of your dataset's own must not resemble those: rename it."
                )


def _composite_problems(cfg, builds: Callable[[str], bool]) -> Iterator[str]:
    if not builds("build_criterion") or cfg.get("criterion_name", None) != _COMPOSITE:
        return
    entries = _mapping(cfg.get("criterion_params")).get("dict_of_loss_params", None)
    if entries is None:
        return  # the signature check names it
    try:
        composite.check_entries(_mapping(entries))
    except ConfigError as error:
        yield str(error)


def keyword_problems(cfg, builds: Callable[[str], bool]) -> list:
    """Every params mapping whose keywords the component receiving them would refuse.

    ``builds(method)`` says whether the trainer builds that way by default, so that the call
    and its receiver are the ones read here.
    """
    problems = list(_loader_key_problems(cfg))
    problems += _composite_problems(cfg, builds)
    for call in (*_component_calls(cfg, builds), *_loader_calls(cfg)):
        problems += _call_problems(call)
    return problems
