"""gatle-ignite: a config-driven training framework for PyTorch, built on PyTorch-Ignite."""

import importlib

from gatle_ignite._version import __version__

# Public names resolve on first use, so `gatle-ignite --version` and config loading do not pay
# for importing torch and ignite.
_EXPORTS = {
    "BaseTrainer": "gatle_ignite.trainer.base",
    "ConfigError": "gatle_ignite.dispatch",
    "EngineSpec": "gatle_ignite.specs",
    "base_config": "gatle_ignite.config.base",
    "build_dataloader": "gatle_ignite.data.helpers",
    "get_aug": "gatle_ignite.data.helpers",
    "get_dataset": "gatle_ignite.data.helpers",
    "get_value": "gatle_ignite.utils.batch",
    "load_weights": "gatle_ignite.run.loading",
    "to_device": "gatle_ignite.utils.batch",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gatle_ignite' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
