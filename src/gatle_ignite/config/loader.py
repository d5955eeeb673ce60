"""Load a config file by path and apply ``--override key=value`` items to it."""

import ast
import importlib.util
import os
import traceback
from collections.abc import Iterable
from typing import Optional, Union

from ml_collections import config_dict

from gatle_ignite.callbacks.run_record import redact_text, shown_value
from gatle_ignite.config.base import OPTIONAL_KNOWN
from gatle_ignite.dispatch import ConfigError

__all__ = ["apply_overrides", "load_config_from_file"]

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
        raise ConfigError(
            f"could not import {path}: {error}\n"
            f"  Run from the directory the config's dotted paths are relative to (the working "
            f"directory goes on sys.path), and use absolute imports only."
        ) from error
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path} must define get_config()")
    try:
        return module.get_config()
    except (TypeError, ValueError) as error:
        line = _refusing_config_line(error, path)
        if line is None:
            raise
        raise ConfigError(
            f"{path}, line {line}: the ConfigDict refused an assignment: {error}\n"
            f"  A field keeps the type of its first value (None is always allowed), and keys "
            f"cannot contain dots."
        ) from error


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


def _unknown_top_level(name: str) -> ConfigError:
    if name in OPTIONAL_KNOWN:
        advice = f"'{name}' is optional and this config never set it; set it in get_config() first."
    else:
        advice = "Only fields the config already has can be overridden; check the spelling."
    return ConfigError(f"cannot override unknown config field '{name}'\n  {advice}")


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


def _set_override(cfg, key: str, value) -> None:
    parts = key.split(".")
    container = cfg
    for depth, segment in enumerate(parts[:-1]):
        prefix = ".".join(parts[: depth + 1])
        if segment not in container:
            if depth == 0:
                raise _unknown_top_level(segment)
            raise ConfigError(f"cannot override unknown config field '{prefix}'")
        container = container[segment]
        if not _is_group(container):
            raise ConfigError(
                f"cannot override '{key}': '{prefix}' is a {type(container).__name__}, "
                f"not a group of fields"
            )
    leaf = parts[-1]
    if leaf not in container:
        if len(parts) == 1:
            raise _unknown_top_level(leaf)
        parent = ".".join(parts[:-1])
        known = sorted(str(name) for name in container.keys())
        raise ConfigError(
            f"cannot override '{key}': '{parent}' has no '{leaf}'.\n  Its fields: {known}"
        )
    try:
        container[leaf] = value
    except (TypeError, ValueError) as error:
        # Not chained: ml_collections' message on a type quotes the value, a secret perhaps.
        raise _refused_override(key, value, container[leaf], error) from None


def apply_overrides(
    cfg: config_dict.ConfigDict, overrides: Optional[Iterable[str]]
) -> config_dict.ConfigDict:
    """Apply ``key=value`` items to ``cfg`` in place; only existing keys can be set."""
    for item in overrides or ():
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        _set_override(cfg, key.strip(), _parse_value(raw))
    return cfg
