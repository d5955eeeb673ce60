"""Process launching: one config in this process (spawning workers), or several as children.

``torch.cuda.device_count``, ``idist.Parallel``, ``subprocess.Popen`` and ``run_task`` are used
through this module's attributes at call time, so users and tests can patch them.
"""

import os
import random
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Optional, Union

import ignite.distributed as idist
import torch
from ml_collections import config_dict

from gatle_ignite.dispatch import ConfigError, import_entrypoint

__all__ = [
    "launch",
    "launch_many",
    "resolve_rendezvous",
    "resolve_topology",
    "run_task",
]

# The dynamic/private port range; ports handed out are distinct but not proven free.
_PORT_RANGE = range(49152, 65535 + 1)
_LOCALHOSTS = ("127.0.0.1", "localhost")
# Set by torchrun and friends; a child that inherited them would try to join the parent's world.
_INHERITED_WORLD_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
)


def run_task(local_rank: int, cfg: config_dict.ConfigDict):
    """Build the config's ``Trainer`` and train it, or only evaluate it in inference mode."""
    Trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    task = Trainer(local_rank, cfg)
    if "run" in cfg:
        task.evaluate()
        return task
    return task.fit()


def _int_field(cfg, field: str, default: Optional[int]) -> Optional[int]:
    value = cfg.get(field, default)
    return default if value is None else int(value)


def resolve_topology(cfg: config_dict.ConfigDict) -> tuple[int, int, int]:
    """``(nproc_per_node, nnodes, node_rank)``; nproc defaults to the visible GPUs, or 1."""
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
    if nproc is None:
        gpus = torch.cuda.device_count()
        nproc = gpus if gpus > 0 else 1
    if nproc < 1:
        raise ConfigError(
            f"nproc_per_node must be >= 1, got {nproc}\n"
            f"  Leave it unset to use every visible GPU (or one process on CPU)."
        )
    return nproc, nnodes, node_rank


def resolve_rendezvous(cfg: config_dict.ConfigDict, nnodes: int) -> tuple[str, int]:
    """``(master_addr, master_port)``: the config first, then the environment, then defaults."""
    port = cfg.get("master_port", None) or os.environ.get("MASTER_PORT")
    addr = cfg.get("master_addr", None) or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    if nnodes > 1:
        if addr in _LOCALHOSTS:
            raise ConfigError(
                f"nnodes={nnodes} but the rendezvous address is {addr!r}: every node would form "
                f"its own world and silently train {nnodes} unrelated models.\n"
                f"  Point cfg.master_addr (or MASTER_ADDR) at node 0's reachable address."
            )
        if not port:
            raise ConfigError(
                f"nnodes={nnodes} but no master_port is set: each node would pick its own "
                f"random port and the rendezvous would hang.\n"
                f"  Set cfg.master_port (or MASTER_PORT) to the same free port on every node."
            )
    return addr, int(port) if port else random.choice(_PORT_RANGE)


def _resolve_backend(cfg: config_dict.ConfigDict) -> str:
    backend = cfg.get("dist_backend", "nccl")
    if backend == "nccl" and not torch.cuda.is_available():
        return "gloo"
    return backend


def _parallel_kwargs(nnodes: int, node_rank: int, addr: str, port: int) -> dict[str, object]:
    # Never init_method (ignite >= 0.5.5 rejects tcp:// ones) and never empty (ignite <= 0.5.3
    # would then hard-code port 2222 and ignore MASTER_PORT).
    kwargs: dict[str, object] = {"master_addr": addr, "master_port": port}
    if nnodes > 1:
        kwargs.update(nnodes=nnodes, node_rank=node_rank)
    return kwargs


def launch(cfg: config_dict.ConfigDict):
    """Run the config here: directly for one process, else through ``idist.Parallel``."""
    nproc, nnodes, node_rank = resolve_topology(cfg)
    addr, port = resolve_rendezvous(cfg, nnodes)
    os.environ["MASTER_PORT"] = str(port)
    os.environ["MASTER_ADDR"] = addr
    if nproc * nnodes <= 1:
        return run_task(0, cfg)
    with idist.Parallel(
        backend=_resolve_backend(cfg),
        nproc_per_node=nproc,
        **_parallel_kwargs(nnodes, node_rank, addr, port),
    ) as parallel:
        parallel.run(run_task, cfg)
    return None


def _child_env(port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _INHERITED_WORLD_VARS}
    env["MASTER_PORT"] = str(port)
    env["MASTER_ADDR"] = "127.0.0.1"
    return env


def _relay(stream, prefix: str) -> None:
    for line in stream:
        text = line.rstrip("\n")
        # One write per line, so lines of concurrent children never interleave mid-line.
        sys.stdout.write(f"[{prefix}] {text}\n")
        sys.stdout.flush()


def launch_many(
    config_paths: Sequence[Union[str, os.PathLike]], extra_args: Optional[list[str]] = None
) -> int:
    """Train each config as its own ``gatle-ignite train`` child; 0 when all succeed, else 1."""
    extra_args = list(extra_args or [])
    ports = random.sample(_PORT_RANGE, len(config_paths))
    children = []
    for path, port in zip(config_paths, ports):
        prefix = Path(path).stem
        print(f"Launching: {path} (MASTER_PORT={port})", flush=True)
        command = [sys.executable, "-m", "gatle_ignite", "train", f"--config={path}", *extra_args]
        child = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=_child_env(port),
        )
        relay = threading.Thread(target=_relay, args=(child.stdout, prefix), daemon=True)
        relay.start()
        children.append((prefix, child, relay))

    # Wait in launch order, and only then join the relays: a relay ends when its child's
    # output closes.
    exit_codes = [(prefix, child.wait()) for prefix, child, _relay in children]
    for _prefix, _child, relay in children:
        relay.join()
    failed = [prefix for prefix, code in exit_codes if code != 0]
    print()
    if failed:
        print(f"Failed configs: {', '.join(failed)}")
        return 1
    print("All configs completed successfully.")
    return 0
