"""The world a run trains in: its topology, rendezvous, backend and collective timeout."""

import contextlib
import datetime
import os
import random
import socket
import warnings
from typing import Optional

import torch
from ml_collections import config_dict

from gatle_ignite.config.topology import topology_fields
from gatle_ignite.dispatch import ConfigError

__all__ = [
    "PORT_RANGE",
    "WORLD_VARS",
    "apply_dist_timeout",
    "dist_timeout",
    "existing_world",
    "free_ports",
    "hidden_from_ignite",
    "parallel_kwargs",
    "resolve_backend",
    "resolve_rendezvous",
    "resolve_topology",
    "warn_if_topology_ignored",
]

# The dynamic/private port range; a port handed out is one no socket of this machine holds then.
PORT_RANGE = range(49152, 65535 + 1)
_LOCALHOSTS = ("127.0.0.1", "localhost")
# Set by torchrun and friends; a child that inherited them would try to join the parent's world.
WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")


def resolve_topology(cfg: config_dict.ConfigDict) -> tuple[int, int, int]:
    """``(nproc_per_node, nnodes, node_rank)``; nproc defaults to the visible GPUs, or 1."""
    nproc, nnodes, node_rank = topology_fields(cfg)
    if nproc is None:
        gpus = torch.cuda.device_count()
        nproc = gpus if gpus > 0 else 1
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
    return addr, int(port) if port else free_ports(1)[0]


def free_ports(count: int) -> list:
    """``count`` distinct ports of PORT_RANGE, drawn at random, that no socket holds now.

    Part of the range is also where the system takes the ports of outgoing connections: on a
    busy machine a port drawn blindly is often in use, and the rendezvous fails to listen.
    """
    ports = []
    for port in random.sample(PORT_RANGE, len(PORT_RANGE)):
        if _bindable(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise ConfigError(
        f"no free port in {min(PORT_RANGE)}-{max(PORT_RANGE)} for the rendezvous.\n"
        f"  Set master_port (or MASTER_PORT) to a port this machine can listen on."
    )


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def resolve_backend(cfg: config_dict.ConfigDict) -> str:
    backend = cfg.get("dist_backend", "nccl")
    if backend == "nccl" and not torch.cuda.is_available():
        return "gloo"
    return backend


def parallel_kwargs(nnodes: int, node_rank: int, addr: str, port: int) -> dict[str, object]:
    # Never init_method (ignite >= 0.5.5 rejects tcp:// ones) and never empty (ignite <= 0.5.3
    # would then hard-code port 2222 and ignore MASTER_PORT).
    kwargs: dict[str, object] = {"master_addr": addr, "master_port": port}
    if nnodes > 1:
        kwargs.update(nnodes=nnodes, node_rank=node_rank)
    return kwargs


def existing_world() -> Optional[str]:
    """``"torchrun"`` or ``"slurm"`` when another launcher already started this rank's world.

    torchrun (and torch.distributed.launch) export RANK, WORLD_SIZE and LOCAL_RANK; a SLURM
    job step started by ``srun`` has a step id and more than one task.
    """
    env = os.environ
    if all(key in env for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        if int(env["WORLD_SIZE"]) > 1:
            return "torchrun"
    if "SLURM_JOB_ID" in env and "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS", 1)) > 1:
        return "slurm"
    return None


@contextlib.contextmanager
def hidden_from_ignite(*names: str):
    """Hide environment variables while ignite builds the world.

    ignite takes the SLURM path whenever SLURM_JOB_ID is set, which refuses the ranks that
    spawning assigns and conflicts with a torchrun world inside an allocation.
    """
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def warn_if_topology_ignored(cfg: config_dict.ConfigDict, world: str) -> None:
    ignored = [k for k in ("nproc_per_node", "master_addr", "master_port") if cfg.get(k, None)]
    if (cfg.get("nnodes", 1) or 1) > 1:
        ignored.append("nnodes")
    if ignored:
        warnings.warn(
            f"this process is one rank of a world {world} started, so that world's size and "
            f"rendezvous are used and {ignored} from the config are ignored.\n"
            f"  Set the topology on the {world} command line instead.",
            stacklevel=3,
        )


def dist_timeout(cfg: config_dict.ConfigDict) -> Optional[datetime.timedelta]:
    seconds = cfg.get("dist_timeout", None)
    return datetime.timedelta(seconds=seconds) if seconds else None


def apply_dist_timeout(cfg: config_dict.ConfigDict) -> None:
    """Give a joined world's process group the config's timeout.

    ignite's Parallel passes a timeout to the ranks it spawns, but none to a group it only
    joins, so the group gets it once made.
    """
    timeout = dist_timeout(cfg)
    if timeout is not None:
        torch.distributed.distributed_c10d._set_pg_timeout(timeout)
