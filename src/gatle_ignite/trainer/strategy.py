"""How the model is spread over the ranks: DDP (a full copy each) or FSDP2 (each rank a shard).

``strategy = "ddp"`` is the default and 0.4's behaviour. ``strategy = "fsdp"`` shards the model
with torch's own ``fully_shard``: every submodule whose class ``fsdp_params["wrap"]`` names
becomes a unit, then the root; the optimizer is built on the sharded parameters afterwards. With
one process there is nothing to shard: the model stays whole, and its checkpoints are written in
the same sharded format, so a run can move between world sizes.

The rule for a ``build_model`` override: return the model as built (compiled or not); the
framework shards it after ``build_model`` returns. A model already sharded by the override
(``fully_shard`` called on it) is left as it is.
"""

import contextlib
import functools
from collections.abc import Iterable

import ignite.distributed as idist
import torch
from torch import nn

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.utils.dist import rank_zero_print

__all__ = [
    "STRATEGIES",
    "ModelState",
    "OptimizerState",
    "apply_activation_checkpointing",
    "ddp_params",
    "distribute",
    "gradient_sync",
    "is_sharded",
    "resolve_sync_bn",
    "shard_model",
    "strategy_of",
]

STRATEGIES = ("ddp", "fsdp")
_FSDP_KEYS = ("wrap", "reshard_after_forward", "param_dtype", "reduce_dtype", "cpu_offload")


def strategy_of(cfg) -> str:
    strategy = cfg.get("strategy", "ddp") or "ddp"
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return strategy


def sync_bn_works(backend: str) -> bool:
    """Whether SyncBatchNorm can train here: DDP accepts it only on CUDA, synchronised by nccl."""
    return backend == "nccl" and torch.cuda.is_available()


def resolve_sync_bn(cfg, backend: str) -> bool:
    """Whether the DDP wrap converts BatchNorm to SyncBatchNorm.

    ``auto_model_params.sync_bn`` unset (None, the default) converts where SyncBatchNorm works;
    an explicit True where it cannot work is a config error, raised before any rank starts.
    """
    params = cfg.get("auto_model_params", None) or {}
    wanted = params.get("sync_bn", False)
    if wanted is not None and not isinstance(wanted, bool):
        raise ConfigError(
            f"auto_model_params.sync_bn must be True, False or None (convert where it works), "
            f"got {wanted!r}"
        )
    works = sync_bn_works(backend)
    if wanted and not works:
        raise ConfigError(
            f"auto_model_params.sync_bn=True, but SyncBatchNorm needs CUDA with the nccl "
            f"backend and this run's backend is {backend}"
            f"{'' if torch.cuda.is_available() else ' on CPU'}.\n"
            f"  Leave sync_bn unset (None converts BatchNorm only where SyncBatchNorm works), or "
            f"set it False."
        )
    return works if wanted is None else wanted


def _has_batchnorm(model: nn.Module) -> bool:
    # The base class torch's own SyncBatchNorm conversion looks for.
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def ddp_params(cfg, model: nn.Module) -> dict:
    """``auto_model_params`` for ``idist.auto_model``, with ``sync_bn`` resolved for this world;
    a BatchNorm model left on plain BatchNorm by the default is told so in one line."""
    params = dict(cfg.get("auto_model_params", None) or {})
    unset = "sync_bn" in params and params["sync_bn"] is None
    backend = idist.backend()
    params["sync_bn"] = resolve_sync_bn(cfg, backend)
    if unset and not params["sync_bn"] and _has_batchnorm(model):
        rank_zero_print(
            f"sync_bn: the {backend} backend cannot synchronise BatchNorm (SyncBatchNorm needs "
            f"CUDA with nccl), so each rank's BatchNorm layers keep their own statistics."
        )
    return params


@functools.cache
def _fsdp():
    """torch's FSDP2 names: public since torch 2.6, under _composable before. Looked up once:
    ``is_sharded`` runs on every training step."""
    try:
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            FSDPModule,
            MixedPrecisionPolicy,
            fully_shard,
        )
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import (
            CPUOffloadPolicy,
            FSDPModule,
            MixedPrecisionPolicy,
            fully_shard,
        )
    return fully_shard, FSDPModule, MixedPrecisionPolicy, CPUOffloadPolicy


def is_sharded(model) -> bool:
    return isinstance(model, _fsdp()[1])


def _matches(module: nn.Module, names: Iterable[str]) -> bool:
    """Whether the module's class is named by ``names``: a class name or a dotted path."""
    cls = type(module)
    return any(name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}") for name in names)


def _units(model: nn.Module, names) -> list:
    units = [m for m in model.modules() if m is not model and _matches(m, names)]
    if names and not units:
        found = sorted({type(m).__name__ for m in model.modules()})
        raise ConfigError(
            f"no submodule of the model has a class named in {list(names)}.\n"
            f"  Its classes: {found}."
        )
    return units


def apply_activation_checkpointing(model: nn.Module, names) -> nn.Module:
    """Recompute the activations of the named submodule classes in backward, saving memory."""
    if not names:
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as apply,
    )

    units = set(map(id, _units(model, names)))
    apply(model, check_fn=lambda module: id(module) in units)
    return model


def _fsdp_settings(cfg) -> dict:
    params = dict(cfg.get("fsdp_params", {}) or {})
    unknown = sorted(set(params) - set(_FSDP_KEYS))
    if unknown:
        raise ConfigError(
            f"fsdp_params has unknown key(s) {unknown}; it takes {list(_FSDP_KEYS)}.\n"
            f"  Fix cfg.fsdp_params."
        )
    return params


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _dtype(name, default):
    if name is None:
        return default
    return _DTYPES.get(name) or getattr(torch, name)


def shard_model(model: nn.Module, cfg, amp_dtype, amp_enabled: bool) -> nn.Module:
    """``fully_shard`` each unit, then the root. Parameters are cast to the AMP dtype for the
    forward and backward unless ``fsdp_params`` says otherwise; gradients reduce in fp32."""
    fully_shard, _module, MixedPrecisionPolicy, CPUOffloadPolicy = _fsdp()
    params = _fsdp_settings(cfg)
    policy = MixedPrecisionPolicy(
        param_dtype=_dtype(params.get("param_dtype"), amp_dtype if amp_enabled else None),
        reduce_dtype=_dtype(params.get("reduce_dtype"), torch.float32 if amp_enabled else None),
    )
    options = {"mp_policy": policy}
    if params.get("cpu_offload", False):
        options["offload_policy"] = CPUOffloadPolicy()
    reshard = params.get("reshard_after_forward", True)
    for unit in _units(model, params.get("wrap", ())):
        fully_shard(unit, reshard_after_forward=reshard, **options)
    # The root's parameters are gathered last in forward and first in backward: keep them.
    fully_shard(model, reshard_after_forward=False, **options)
    return model


def distribute(model: nn.Module, cfg, amp_dtype, amp_enabled: bool) -> nn.Module:
    """What the strategy does to the model ``build_model`` returned: activation checkpointing
    of the configured classes, then, under ``fsdp`` with several ranks, the sharding."""
    apply_activation_checkpointing(
        getattr(model, "module", model), cfg.get("activation_checkpointing")
    )
    if strategy_of(cfg) == "fsdp" and idist.get_world_size() > 1 and not is_sharded(model):
        shard_model(model, cfg, amp_dtype, amp_enabled)
    return model


def gradient_sync(model, enabled: bool):
    """The context for one micro-batch: gradients synchronise only when ``enabled`` (the last
    micro-batch of an accumulation window). FSDP2 has a switch, DDP a context."""
    if is_sharded(model):
        model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    if enabled or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def _state_dict_api():
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _sharded_values(state: dict) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(v, DTensor) for v in state.values())


class ModelState:
    """The model as a checkpoint holds it: fully-qualified names (no ``module.`` of DDP or
    ``_orig_mod.`` of compile), sharded tensors under FSDP, full ones otherwise."""

    def __init__(self, model, strict: bool = True):
        self.model = model
        self.strict = strict

    def state_dict(self) -> dict:
        return _state_dict_api().get_model_state_dict(self.model)

    def load_state_dict(self, state: dict) -> None:
        api = _state_dict_api()
        full = is_sharded(self.model) and not _sharded_values(state)
        options = api.StateDictOptions(full_state_dict=full, strict=self.strict)
        api.set_model_state_dict(self.model, state, options=options)


class OptimizerState:
    """The optimizer's state keyed by parameter name, so it reshards across world sizes."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict:
        return _state_dict_api().get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict) -> None:
        _state_dict_api().set_optimizer_state_dict(self.model, self.optimizer, state)
