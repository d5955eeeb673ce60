"""The topology fields (``nnodes``, ``node_rank``, ``nproc_per_node``), checked from the config
alone: the pre-flight refuses what the launcher would, before any process starts."""

from typing import Optional

from gatle_ignite.dispatch import ConfigError

__all__ = ["topology_fields"]


def _int_field(cfg, field: str, default: Optional[int]) -> Optional[int]:
    value = cfg.get(field, default)
    return default if value is None else int(value)


def topology_fields(cfg) -> tuple:
    """``(nproc_per_node or None when unset, nnodes, node_rank)``; a value out of range is a
    ConfigError, one that is no whole number a TypeError or ValueError."""
    nnodes = _int_field(cfg, "nnodes", 1)
    if nnodes < 1:
        raise ConfigError(
            f"nnodes must be >= 1, got {nnodes}\n  It is the number of machines; 1 for one."
        )
    node_rank = _int_field(cfg, "node_rank", 0)
    if not 0 <= node_rank < nnodes:
        raise ConfigError(
            f"node_rank must be in 0..{nnodes - 1} for nnodes={nnodes}, got {node_rank}\n"
            f"  Give every machine its own index, e.g. --override node_rank=K."
        )
    nproc = _int_field(cfg, "nproc_per_node", None)
    if nproc is not None and nproc < 1:
        raise ConfigError(
            f"nproc_per_node must be >= 1, got {nproc}\n"
            f"  Leave it unset to use every visible GPU (or one process on CPU)."
        )
    return nproc, nnodes, node_rank
