"""What a sweep is: the config, the space, the trial count and how they are searched.

Given on the command line, or in a sweep file beside the configs (a module whose ``get_sweep()``
returns the same fields as a dict) so that it is reviewed and versioned like a config; a flag
given on the command line wins over the file's field.
"""

import importlib.util
import os
from dataclasses import dataclass, field, replace
from typing import Optional

from gatle_ignite.config.names import HINT_CUTOFF, closest
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.sweep.reconnect import DEFAULT_RETRY_S
from gatle_ignite.sweep.space import Param, parse_param, parse_space

__all__ = [
    "PRUNERS",
    "SAMPLERS",
    "Sweep",
    "check_grid",
    "enqueued_trials",
    "grid_size",
    "load_sweep_file",
    "merge",
]

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "hyperband", "none")
DIRECTIONS = ("maximize", "minimize")


@dataclass(frozen=True)
class Sweep:
    """A sweep's definition. ``metric`` and ``direction`` None: the config's score decides."""

    config: str
    dir: str
    trials: Optional[int]
    params: tuple
    overrides: tuple = ()
    workers: int = 1
    storage: Optional[str] = None
    study: Optional[str] = None
    sampler: str = "tpe"
    pruner: str = "median"
    pruner_params: dict = field(default_factory=dict)
    metric: Optional[str] = None
    direction: Optional[str] = None
    max_failures: int = 3
    enqueue: tuple = ()
    storage_retry: int = DEFAULT_RETRY_S

    def space(self) -> dict:
        """``{key: Param}``, in the order given."""
        return {param.key: param for param in self.params}


# A sweep file's fields: name -> (check, what it must be).
_FIELDS = {
    "config": (lambda v: isinstance(v, str) and v, "the config file's path"),
    "dir": (lambda v: isinstance(v, (str, os.PathLike)) and str(v), "a directory path"),
    "trials": (lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    "params": (lambda v: isinstance(v, dict) and v, "a non-empty dict {key: space}"),
    "overrides": (
        lambda v: isinstance(v, dict) or (isinstance(v, (list, tuple)) and _all_str(v)),
        "a dict {key: value} or a list of 'key=value' strings",
    ),
    "workers": (lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    "storage": (lambda v: v is None or isinstance(v, str), "a storage URL"),
    "study": (lambda v: v is None or (isinstance(v, str) and v), "a study name"),
    "sampler": (lambda v: v in SAMPLERS, f"one of {', '.join(SAMPLERS)}"),
    "pruner": (lambda v: v in PRUNERS, f"one of {', '.join(PRUNERS)}"),
    "pruner_params": (lambda v: isinstance(v, dict), "a dict of the pruner's arguments"),
    "metric": (lambda v: v is None or (isinstance(v, str) and v), "a metric name"),
    "direction": (lambda v: v is None or v in DIRECTIONS, "'maximize' or 'minimize'"),
    "max_failures": (lambda v: _is_int(v) and v >= 0, "an int >= 0 (0: never stop)"),
    "enqueue": (
        lambda v: isinstance(v, (list, tuple)) and all(isinstance(e, dict) for e in v),
        "a list of {key: value} dicts, trials to run first",
    ),
    "storage_retry": (lambda v: _is_int(v) and v >= 0, "an int >= 0 (seconds; 0 never retries)"),
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _all_str(values) -> bool:
    return all(isinstance(v, str) for v in values)


def load_sweep_file(path: str) -> dict:
    """The fields a sweep file's ``get_sweep()`` returns, each checked."""
    if not os.path.isfile(path):
        raise ConfigError(f"sweep file not found: {path}")
    spec = importlib.util.spec_from_file_location("gatle_sweep_module", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        raise ConfigError(
            f"could not import {path}: {error}\n"
            f"  Run from the directory its imports are relative to, with absolute imports."
        ) from error
    if not hasattr(module, "get_sweep"):
        raise ConfigError(f"sweep file {path} must define get_sweep()")
    fields = module.get_sweep()
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: get_sweep() must return a dict, got {type(fields).__name__}")
    problems = []
    for name, value in fields.items():
        if name not in _FIELDS:
            near = closest(str(name), list(_FIELDS), HINT_CUTOFF)
            hint = f"; did you mean {near!r}?" if near else ""
            problems.append(f"{name!r} is not a sweep field{hint}")
            continue
        check, expected = _FIELDS[name]
        if not check(value):
            problems.append(f"{name} must be {expected}, got {value!r}")
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        raise ConfigError(
            f"{path}: get_sweep() returned {len(problems)} field(s) that cannot be used:\n"
            f"{listed}\n  Its fields: {', '.join(_FIELDS)}."
        )
    return fields


def _file_overrides(value) -> tuple:
    if isinstance(value, dict):
        return tuple(f"{key}={item!r}" for key, item in value.items())
    return tuple(value)


def _params(file_params: dict, cli_params: list) -> tuple:
    space = {key: parse_space(key, text) for key, text in file_params.items()}
    for item in cli_params:
        param = parse_param(item)
        space[param.key] = param
    return tuple(space.values())


# Given in a sweep file only; every other field also has a flag.
_FILE_ONLY = ("params", "overrides", "enqueue", "pruner_params")
_DEFAULTS = {
    "workers": 1,
    "sampler": "tpe",
    "pruner": "median",
    "max_failures": 3,
    "storage_retry": DEFAULT_RETRY_S,
}


def merge(cli: dict, file_fields: Optional[dict] = None) -> Sweep:
    """The sweep: the file's fields, then every flag given on the command line.

    ``cli`` holds the flags as argparse left them: None (or an empty list) when not given.
    """
    file_fields = dict(file_fields or {})
    chosen = {}
    for name in _FIELDS:
        if name in _FILE_ONLY:
            continue
        value = cli.get(name)
        chosen[name] = value if value is not None else file_fields.get(name)
    problems = [
        f"--{name.replace('_', '-')} must be {_FIELDS[name][1]}, got {value!r}"
        for name, value in chosen.items()
        if value is not None and not _FIELDS[name][0](value)
    ]
    if problems:
        raise ConfigError("\n".join(problems))
    missing = [f"--{name}" for name in ("config", "dir") if chosen[name] is None]
    if missing:
        raise ConfigError(
            f"a sweep needs {' and '.join(missing)}, on the command line or in the sweep file"
        )
    params = _params(file_fields.get("params", {}), cli.get("params") or [])
    if not params:
        raise ConfigError(
            "a sweep needs at least one --param KEY=SPACE (or params in the sweep file)\n"
            "  For example --param 'optimizer_params.lr=loguniform(1e-4, 1e-2)'."
        )
    for name, default in _DEFAULTS.items():
        if chosen[name] is None:
            chosen[name] = default
    chosen["dir"] = os.fspath(chosen["dir"])
    overrides = _file_overrides(file_fields.get("overrides", ()))
    sweep = Sweep(
        **chosen,
        params=params,
        overrides=overrides + tuple(cli.get("overrides") or ()),
        pruner_params=dict(file_fields.get("pruner_params", {})),
        enqueue=tuple(file_fields.get("enqueue", ())),
    )
    if sweep.trials is None and sweep.sampler != "grid":
        raise ConfigError(
            "a sweep needs --trials N (or trials in the sweep file); only a grid counts its own"
        )
    return sweep


def grid_size(params) -> int:
    size = 1
    for param in params:
        size *= len(param.choices)
    return size


def check_grid(sweep: Sweep) -> Sweep:
    """A grid sweep: every parameter a list, and at most as many trials as grid points."""
    if sweep.sampler != "grid":
        return sweep
    ranges = [p.key for p in sweep.params if p.kind != "choice"]
    if ranges:
        raise ConfigError(
            f"--sampler grid needs a list of values for every parameter; {', '.join(ranges)} "
            f"{'is a range' if len(ranges) == 1 else 'are ranges'}.\n"
            f"  Give the values to try, e.g. --param 'optimizer_params.lr=[1e-4, 1e-3, 1e-2]'."
        )
    points = grid_size(sweep.params)
    if sweep.trials is None:
        return replace(sweep, trials=points)
    if sweep.trials > points:
        raise ConfigError(
            f"--trials {sweep.trials}, but the grid has {points} point(s): a grid tries each "
            f"once.\n  Ask for --trials {points} or fewer, or leave --trials out."
        )
    return sweep


def enqueued_trials(sweep: Sweep) -> list:
    """The trials to run first, each checked against the space."""
    space: dict = sweep.space()
    checked = []
    for index, entry in enumerate(sweep.enqueue):
        for key, value in entry.items():
            param: Optional[Param] = space.get(key)
            if param is None:
                raise ConfigError(
                    f"enqueue[{index}] sets {key!r}, which is not a parameter of the sweep "
                    f"({', '.join(space)})"
                )
            if not param.admits(value):
                raise ConfigError(
                    f"enqueue[{index}] sets {key}={value!r}, outside its space {param.text()}"
                )
        checked.append(dict(entry))
    return checked
