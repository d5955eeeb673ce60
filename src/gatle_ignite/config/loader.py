"""Load a config file by path and apply ``--override key=value`` items to it."""

import ast
import contextlib
import importlib.util
import os
import traceback
from collections.abc import Iterable, Sequence
from typing import Optional, Union

from ml_collections import config_dict

from gatle_ignite.callbacks.run_record import redact_text, shown_value
from gatle_ignite.config.base import OPTIONAL_KNOWN
from gatle_ignite.config.names import HINT_CUTOFF, TYPO_CUTOFF, closest, framework_fields
from gatle_ignite.config.presets import note_set, presets_watched, settle
from gatle_ignite.dispatch import ConfigError, shadowing_hint

__all__ = ["apply_overrides", "load_config_from_file", "require_config"]

_MODULE_NAME = "gatle_config_module"


def load_config_from_file(path: Union[str, os.PathLike]):
    """Execute the config file at ``path`` and return what its ``get_config()`` returns."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"could not load a python module from: {path}")
    # Deliberately kept out of sys.modules: loading one config must not shadow another.
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        if "relative import" in str(error):
            raise ConfigError(
                f"config {path} uses a relative import ({error}).\n"
                f"  Configs are loaded by path and have no parent package, so they must use "
                f"absolute imports, for example `from dataloaders.vocab import X`, not "
                f"`from .vocab import X`."
            ) from error
        shadowed = shadowing_hint(error.name or "")
        if shadowed:
            raise ConfigError(f"could not import {path}: {error}\n{shadowed}") from error
        raise ConfigError(
            f"could not import {path}: {error}\n"
            f"  Run from the directory the config's dotted paths are relative to (the working "
            f"directory goes on sys.path), and use absolute imports only."
        ) from error
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path} must define get_config()")
    try:
        with presets_watched():
            cfg = module.get_config()
        settle(cfg)
        return cfg
    except (TypeError, ValueError) as error:
        line = _refusing_config_line(error, path)
        if line is None:
            raise
        raise ConfigError(
            f"{path}, line {line}: the ConfigDict refused an assignment: {error}\n"
            f"  A field keeps the type of its first value (None is always allowed), and keys "
            f"cannot contain dots."
        ) from error


def require_config(cfg, path: Union[str, os.PathLike]) -> config_dict.ConfigDict:
    """``cfg`` if it is a ConfigDict, else a config error naming the file that returned it.

    The command line asks it of every config it loads; ``load_config_from_file`` returns what
    ``get_config()`` returned unchecked, as 0.4 did.
    """
    if isinstance(cfg, config_dict.ConfigDict):
        return cfg
    returned = "None" if cfg is None else f"a {type(cfg).__name__}"
    raise ConfigError(
        f"get_config() in {os.fspath(path)} returned {returned}, not a ConfigDict.\n"
        f"  Build the config from gatle_ignite.base_config() and end get_config() with "
        f"`return cfg`."
    )


def _refusing_config_line(error: BaseException, path: str) -> Optional[int]:
    """The config file's line when ml_collections raised ``error``, else None."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames or "ml_collections" not in frames[-1].filename:
        return None
    here = os.path.abspath(path)
    lines = [f.lineno for f in frames if os.path.abspath(f.filename) == here]
    return lines[-1] if lines else None


def _parse_value(raw: str):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def _is_group(value) -> bool:
    return hasattr(value, "keys") and hasattr(value, "__getitem__")


# Keyword arguments handed to a component whole: their keys are the component's, not ours.
_PARAMS_FIELDS = (
    "model_params",
    "auto_model_params",
    "aug_params",
    "criterion_params",
    "optimizer_params",
    "lr_scheduler_params",
    "compile_params",
)
_WHERE_KEYS_ARE_ADDED = (
    f"New keys can be added only inside the params mappings ({', '.join(_PARAMS_FIELDS)}, "
    f"every *_ds_params, and a metric's params)."
)


def _is_metric_params(path: Sequence[str]) -> bool:
    """Whether ``path`` is ``<field>_metrics.<entry>.params``, one metric's keyword arguments."""
    return len(path) == 3 and path[0].endswith("_metrics") and path[2] == "params"


def _is_params(group_path: Sequence[str]) -> bool:
    """Whether the group at ``group_path`` lies inside a free-form params mapping."""
    top = group_path[0]
    return top in _PARAMS_FIELDS or top.endswith("_ds_params") or _is_metric_params(group_path[:3])


def _did_you_mean(*names: Optional[str]) -> str:
    shown = [repr(name) for name in names if name is not None]
    return f"; did you mean {' or '.join(shown)}?" if shown else ""


def _homes_of(cfg, name: str) -> list[str]:
    """The dotted keys one group down where ``name`` lives (``lr`` -> ``optimizer_params.lr``)."""
    return [
        f"{field}.{name}"
        for field, value in cfg.items()
        if _is_group(value) and name in value.keys()
    ]


def _unknown_top_level(cfg, name: str) -> ConfigError:
    if name in OPTIONAL_KNOWN:
        advice = f"'{name}' is optional and this config never set it; set it in get_config() first."
        return ConfigError(f"cannot override unknown config field '{name}'\n  {advice}")
    fields = framework_fields() | {field for field in cfg.keys() if isinstance(field, str)}
    near = closest(name, fields, HINT_CUTOFF)
    hint = _did_you_mean(near) if near else _did_you_mean(*_homes_of(cfg, name))
    return ConfigError(
        f"cannot override unknown config field '{name}'{hint}\n"
        f"  Only fields the config already has can be overridden; check the spelling."
    )


def _unknown_in_group(key: str, prefix: str, group, name: str) -> ConfigError:
    """``name`` is missing from the group at ``prefix`` and cannot be added there."""
    known = sorted(str(field) for field in group.keys())
    hint = _did_you_mean(closest(name, known, HINT_CUTOFF))
    return ConfigError(
        f"cannot override '{key}': '{prefix}' has no '{name}'{hint}"
        f"\n  Its fields: {known}. {_WHERE_KEYS_ARE_ADDED}"
    )


def _unknown_intermediate(path: Sequence[str], group) -> ConfigError:
    """The group ``path`` names does not exist; only a whole one can be added, as a value."""
    parent = ".".join(path[:-1])
    near = closest(path[-1], [str(name) for name in group.keys()], HINT_CUTOFF)
    hint = _did_you_mean(f"{parent}.{near}" if near else None)
    message = f"cannot override unknown config field '{'.'.join(path)}'{hint}"
    if not _is_params(path[:-1]):
        return ConfigError(f"{message}\n  {_WHERE_KEYS_ARE_ADDED}")
    return ConfigError(
        f"{message}\n  Only the last part of a key is added; to add a group, give it whole: "
        f'"{".".join(path)}={{...}}".'
    )


def _refused_override(key: str, value, held, error: Exception) -> ConfigError:
    """Why ml_collections refused ``value`` for field ``key``, showing no secret."""
    shown = f"cannot override '{key}' with {shown_value(key, value)}"
    if isinstance(error, ValueError):
        # A dict value with a dotted key; the message names the key, not the value.
        return ConfigError(f"{shown}: {redact_text(str(error))}")
    return ConfigError(
        f"{shown} (of type {type(value).__name__}): a field keeps the type of its first value.\n"
        f"  Give a value of the type the field already holds ({type(held).__name__})."
    )


def _group_of(cfg, key: str, parts: Sequence[str]):
    """The mapping that holds the last part of ``key``; every part before it must exist."""
    container = cfg
    for depth, segment in enumerate(parts[:-1]):
        prefix = ".".join(parts[: depth + 1])
        if segment not in container and _is_metric_params(parts[: depth + 1]):
            # A metric entry may leave out its params; a key added to them starts the mapping.
            _add_key(key, container, segment, {})
        if segment not in container:
            if depth == 0:
                raise _unknown_top_level(cfg, segment)
            raise _unknown_intermediate(parts[: depth + 1], container)
        container = container[segment]
        if not _is_group(container):
            raise ConfigError(
                f"cannot override '{key}': '{prefix}' is a {type(container).__name__}, "
                f"not a group of fields"
            )
    return container


def _check_new_key(key: str, parts: Sequence[str], group, value) -> None:
    """Refuse adding the last part of ``key`` unless it is a params key and no misspelling, or
    a metric entry's whole ``params``, a mapping."""
    leaf, parent = parts[-1], ".".join(parts[:-1])
    if _is_metric_params(parts):
        if not _is_group(value) and not isinstance(value, dict):
            raise ConfigError(
                f"cannot set '{key}' to {shown_value(key, value)}: a metric's params is a "
                f"mapping of its keyword arguments, e.g. \"{key}={{'src_name': 'logits'}}\"."
            )
        return
    if not _is_params(parts[:-1]):
        raise _unknown_in_group(key, parent, group, leaf)
    if not leaf.isidentifier():
        raise ConfigError(f"cannot add '{key}': '{leaf}' is not a Python identifier")
    # A typo must not add a dead key next to the one it meant.
    near = closest(leaf, [str(name) for name in group.keys()], TYPO_CUTOFF)
    if near is not None:
        raise ConfigError(
            f"cannot add '{key}': it looks like a misspelling of '{parent}.{near}'.\n"
            f"  To add a key this close to an existing one, set it in get_config()."
        )


def _is_dunder(name) -> bool:
    return isinstance(name, str) and name.startswith("__") and name.endswith("__")


def _refuse_special_names(key: str, value) -> None:
    """No part of ``key``, and no key of a dict ``value`` at any depth, may be a special name
    (``__class__``): no component takes one as a keyword argument, and ml_collections fails on
    some of them long after the override."""
    names = [(key, part) for part in key.split(".")]
    pending = [(key, value)]
    while pending:
        where, group = pending.pop()
        if _is_group(group):
            names += [(f"{where}.{name}", name) for name in group.keys()]
            pending += [(f"{where}.{name}", group[name]) for name in group.keys()]
    for where, name in names:
        if _is_dunder(name):
            raise ConfigError(
                f"cannot set '{where}': '{name}' is a Python special name, not a keyword "
                f"argument a component takes.\n"
                f"  Check the key's spelling."
            )


def _add_key(key: str, group, leaf: str, value) -> None:
    unlocked = getattr(group, "unlocked", None)
    # A locked ConfigDict refuses new keys; the params mapping is free-form, so lift the lock.
    with unlocked() if unlocked is not None else contextlib.nullcontext():
        try:
            group[leaf] = value
        except (TypeError, ValueError) as error:
            raise ConfigError(
                f"cannot add '{key}' with {shown_value(key, value)}: {redact_text(str(error))}"
            ) from None


def _set_override(cfg, key: str, value) -> None:
    parts = key.split(".")
    if len(parts) > 1 and not all(parts):
        raise ConfigError(f"override key '{key}' has an empty part")
    _refuse_special_names(key, value)
    group = _group_of(cfg, key, parts)
    leaf = parts[-1]
    if leaf not in group:
        if len(parts) == 1:
            raise _unknown_top_level(cfg, leaf)
        _check_new_key(key, parts, group, value)
        _add_key(key, group, leaf, value)
        return
    try:
        group[leaf] = value
    except (TypeError, ValueError) as error:
        # Not chained: ml_collections' message on a type quotes the value, a secret perhaps.
        raise _refused_override(key, value, group[leaf], error) from None


def apply_overrides(
    cfg: config_dict.ConfigDict, overrides: Optional[Iterable[str]]
) -> config_dict.ConfigDict:
    """Apply ``key=value`` items to ``cfg`` in place.

    Only existing fields can be set, except that a params mapping (``optimizer_params``, every
    ``*_ds_params``, a metric's ``params``, ...) takes new keys: they are the component's own.
    A new ``name`` moves a save_dir named after the run with it, unless ``save_dir`` is set too.
    """
    named_dir = _named_save_dir(cfg)
    keys = set()
    for item in overrides or ():
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        keys.add(key.strip())
        _set_override(cfg, key.strip(), _parse_value(raw))
        note_set(cfg, key.strip())
    if named_dir is not None and "name" in keys and "save_dir" not in keys:
        cfg["save_dir"] = os.path.join(named_dir, cfg["name"])
    return cfg


def _named_save_dir(cfg) -> Optional[str]:
    """The folder of ``save_dir`` when the save_dir is named after the run (it ends in ``name``,
    as ``ckpt_dir(cfg.name)`` makes it), so that a new name gives the run its own directory."""
    name, save_dir = cfg.get("name", None), cfg.get("save_dir", None)
    if not isinstance(name, str) or not name or not isinstance(save_dir, str):
        return None
    folder, last = os.path.split(save_dir.rstrip("/\\"))
    return folder if last == name else None
