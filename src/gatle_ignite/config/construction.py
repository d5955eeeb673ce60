"""The value checks the optimizer, the scheduler and the loss make when they are built, made
before anything is built: each built-in the config names is constructed on a stand-in, which
costs a few tensors of one element, no data and no model.

The optimizer is built on a module of one parameter, the scheduler on that optimizer with a
stand-in for the training loader, each loss term with its params. So a value their
constructors refuse (torch's ``Invalid learning rate: -0.001``) is a config error of the
pre-flight, with the field named, and ``config`` refuses what ``train`` would.

Only the framework's own built-ins are constructed: a project's ``get_optimizer``,
``get_scheduler`` or ``Loss`` may read the real model's structure or the data, or load
weights, and a failure on a stand-in would say nothing about the run.
"""

import warnings
from typing import Callable, Optional

import torch
from torch import nn

from gatle_ignite.dispatch import ConfigError, call_with_params, import_entrypoint

__all__ = ["construction_problems"]

_BUILT_IN = "gatle_ignite."
_COMPOSITE = "gatle_ignite.losses.composite"
# Built-ins that read the model's structure (layer_decay resolves its backbone and its blocks),
# which the stand-in lacks.
_NEED_THE_MODEL = ("gatle_ignite.optimizers.layer_decay",)


class _StandIn(nn.Module):
    """A model of one parameter, for an optimizer to be built on."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))


class _NeedsData(Exception):
    """The scheduler asked for the training loader's length, which only the data knows."""


class _UnbuiltLoader:
    """The training loader before any data is read: its length is unknown."""

    def __len__(self):
        raise _NeedsData


def _built_in(path) -> bool:
    return isinstance(path, str) and path.startswith(_BUILT_IN)


def _refusal(build: Callable) -> tuple:
    """``(what build returned, [])``, ``(None, [its config error])``, or ``(None, [])`` when it
    failed otherwise: that is the stand-in's limit, not the config's, and train will tell."""
    try:
        with warnings.catch_warnings():
            # What building warns about, training says again, where it matters.
            warnings.simplefilter("ignore")
            return build(), []
    except ConfigError as error:
        return None, [str(error)]
    except _NeedsData:
        raise
    except Exception:
        return None, []


def _optimizer(cfg) -> tuple:
    name = cfg.optimizer_name
    if not _built_in(name) or name in _NEED_THE_MODEL:
        return None, []
    get_optimizer = import_entrypoint(name, "get_optimizer", field="optimizer_name")
    params = cfg.get("optimizer_params", None)
    return _refusal(lambda: call_with_params(get_optimizer, params, "optimizer_params", _StandIn()))


def _scheduler_problems(cfg, optimizer) -> list:
    from gatle_ignite.schedulers import prep_scheduler

    name = cfg.get("lr_scheduler", None)
    if not _built_in(name):
        return []
    if optimizer is None:
        optimizer = torch.optim.SGD(_StandIn().parameters(), lr=1e-3)
    engines = {"trainer": None, "evaluator": None, "tester": None}
    try:
        return _refusal(lambda: prep_scheduler(name, cfg, _UnbuiltLoader(), optimizer, engines))[1]
    except _NeedsData:
        return []  # it needs the epoch's length (train_length unset): train checks it


def _loss_problems(cfg) -> list:
    name = cfg.criterion_name
    params = cfg.get("criterion_params", None) or {}
    if name == _COMPOSITE:
        return [
            problem
            for key, entry in (params.get("dict_of_loss_params", None) or {}).items()
            for problem in _term_problems(key, entry)
        ]
    if not _built_in(name):
        return []
    Loss = import_entrypoint(name, "Loss", field="criterion_name")
    return _refusal(lambda: call_with_params(Loss, params, "criterion_params"))[1]


def _term_problems(key: str, entry) -> list:
    path = entry.get("cls_name", None) if hasattr(entry, "get") else None
    if not _built_in(path):
        return []
    field = f"criterion_params.dict_of_loss_params.{key}"
    Loss = import_entrypoint(path, "Loss", field=f"{field}.cls_name")
    params = entry.get("loss_params", None)
    return _refusal(lambda: call_with_params(Loss, params, f"{field}.loss_params"))[1]


def construction_problems(cfg, builds: Callable[[str], bool]) -> list:
    """What the built-in optimizer, scheduler and loss terms refuse when constructed with the
    config's values, one message each; for a trainer that builds them its default way
    (``builds(method)``)."""
    problems = []
    optimizer: Optional[torch.optim.Optimizer] = None
    if builds("build_optimizer"):
        optimizer, problems = _optimizer(cfg)
    if builds("build_scheduler") and not problems:
        problems += _scheduler_problems(cfg, optimizer)
    if builds("build_criterion"):
        problems += _loss_problems(cfg)
    return problems
