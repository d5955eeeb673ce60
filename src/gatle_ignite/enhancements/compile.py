"""torch.compile as a config field: in place, before any DDP wrap, so state dicts stay clean."""

import ignite.distributed as idist
import torch

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.utils.dist import rank_zero_print

__all__ = [
    "check_build_model_override",
    "check_compile_value",
    "compile_built_model",
    "compile_model",
    "is_compiled",
    "resolve_compile",
]

_AUTO = "auto"
_MAX_WRAPPER_DEPTH = 8


def _would_be_skipped(model) -> bool:
    """Whether dynamo skips this module's forward (torch's own containers, DDP)."""
    try:
        from torch._dynamo.trace_rules import check
    except ImportError:
        return False
    return bool(check(type(model).forward))


def _qualified(model) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def compile_model(model, compile_params=None):
    """Compile ``model`` in place with ``model.compile()``; returns the same object."""
    if _would_be_skipped(model):
        raise ConfigError(
            f"cfg.compile is set, but dynamo skips {_qualified(model)} (defined inside torch), "
            f"so nothing would compile.\n"
            f"  Wrap it in your own nn.Module subclass, or unset cfg.compile."
        )
    model.compile(**dict(compile_params or {}))
    return model


def is_compiled(module) -> bool:
    """True when ``module`` (or a wrapper's ``.module``) was compiled in place."""
    for _ in range(_MAX_WRAPPER_DEPTH):
        if getattr(module, "_compiled_call_impl", None) is not None:
            return True
        inner = getattr(module, "module", None)
        if inner is None or inner is module or not hasattr(inner, "state_dict"):
            return False
        module = inner
    return False


def check_compile_value(cfg):
    value = cfg.get("compile", None)
    if value is None or isinstance(value, bool) or value == _AUTO:
        return
    raise ConfigError(f'cfg.compile must be True, False or "auto", got {value!r}.')


def resolve_compile(cfg) -> bool:
    """The compile decision for this run. Builds nothing and draws no random numbers."""
    check_compile_value(cfg)
    value = cfg.get("compile", None)
    if value != _AUTO:
        return bool(value)
    device_type = idist.device().type
    if device_type == "cpu":
        rank_zero_print(
            "[compile] auto -> OFF (no accelerator; compiling CPU training rarely pays)"
        )
        return False
    rank_zero_print(f"[compile] auto -> ON ({device_type}, torch {torch.__version__})")
    return True


def compile_built_model(model, cfg) -> bool:
    """Compile the freshly built model when the config asks; returns the decision."""
    compiling = resolve_compile(cfg)
    if compiling and cfg.get("compile", None) == _AUTO and _would_be_skipped(model):
        rank_zero_print(
            f"[compile] auto -> OFF ({type(model).__name__} is defined inside torch, so dynamo "
            f"would skip it and compile nothing)"
        )
        compiling = False
    if compiling:
        compile_model(model, cfg.get("compile_params", None))
    return compiling


def check_build_model_override(model, compiling, cfg):
    """Refuse a build_model override that ignored cfg.compile."""
    if compiling is None:
        compiling = resolve_compile(cfg)
    if compiling and not is_compiled(model):
        raise ConfigError(
            "cfg.compile is set, but build_model() returned a model the framework does not "
            "consider compiled.\n"
            "  torch.compile(model) and self.encoder.compile() do not count: call "
            "gatle_ignite.enhancements.compile.compile_model(model) or model.compile() on the "
            "model you return, before any DDP wrap."
        )
