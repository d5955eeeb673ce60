"""Launching: one config in this process (spawning workers), or several as children.

``gatle_ignite.cli.launch`` is this module under its 0.4 name. ``torch.cuda.device_count``,
``idist.Parallel``, ``subprocess.Popen`` and ``run_task`` are used through this module's
attributes at call time, so users and tests can patch them.
"""

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional, Union

import ignite.distributed as idist

# An attribute of this module by contract (CONTRACT 2.6): users patch launch.torch.cuda.
import torch  # noqa: F401
from ml_collections import config_dict

from gatle_ignite.launch.budget import ranks_share, shares
from gatle_ignite.launch.ranks import EXIT_PEER_TIMEOUT, supervised
from gatle_ignite.launch.task import run_task
from gatle_ignite.launch.world import (
    WORLD_VARS,
    apply_dist_timeout,
    dist_timeout,
    existing_world,
    free_ports,
    hidden_from_ignite,
    resolve_backend,
    resolve_rendezvous,
    resolve_topology,
    warn_if_topology_ignored,
)
from gatle_ignite.launch.world import parallel_kwargs as _parallel_kwargs
from gatle_ignite.trainer.strategy import resolve_sync_bn
from gatle_ignite.utils.dist import quiet_ignite_loggers

__all__ = [
    "EXIT_PEER_TIMEOUT",
    "launch",
    "launch_many",
    "resolve_rendezvous",
    "resolve_topology",
    "run_task",
]

# 0.4's name for it, part of the public surface.
_resolve_backend = resolve_backend


def _join(cfg: config_dict.ConfigDict, world: str, task_args: tuple) -> None:
    warn_if_topology_ignored(cfg, world)
    resolve_sync_bn(cfg, resolve_backend(cfg))
    hidden = () if world == "slurm" else ("SLURM_JOB_ID",)
    with hidden_from_ignite(*hidden), idist.Parallel(backend=resolve_backend(cfg)) as parallel:
        apply_dist_timeout(cfg)
        parallel.run(run_task, *task_args)


def launch(cfg: config_dict.ConfigDict, job: Optional[Callable] = None):
    """Run the config here: join a world torchrun or srun started, run directly for one
    process, or spawn this node's workers through ``idist.Parallel``.

    ``job``, a picklable ``job(trainer)``, replaces fit/evaluate on every rank (see run_task).
    """
    quiet_ignite_loggers(cfg.get("verbosity", 1))
    # Without a job the workers get exactly (cfg,), as before there were jobs.
    task_args = (cfg,) if job is None else (cfg, job)
    world = existing_world()
    if world is not None:
        return _join(cfg, world, task_args)
    nproc, nnodes, node_rank = resolve_topology(cfg)
    addr, port = resolve_rendezvous(cfg, nnodes)
    os.environ["MASTER_PORT"] = str(port)
    os.environ["MASTER_ADDR"] = addr
    if nproc * nnodes <= 1:
        return run_task(0, *task_args)
    # A config error here, before any rank starts, rather than one traceback per rank.
    resolve_sync_bn(cfg, resolve_backend(cfg))
    kwargs = _parallel_kwargs(nnodes, node_rank, addr, port)
    timeout = dist_timeout(cfg)
    if timeout is not None:
        # ignite hands it on to every spawned rank's init_process_group.
        kwargs["timeout"] = timeout
    # The launcher of the node where rank 0 runs records a failure rank 0 could not.
    recorded_at = cfg.save_dir if node_rank == 0 else None
    with (
        hidden_from_ignite("SLURM_JOB_ID"),
        supervised(nproc, recorded_at, first_rank=node_rank * nproc),
        ranks_share(nproc),
    ):
        with idist.Parallel(
            backend=resolve_backend(cfg), nproc_per_node=nproc, **kwargs
        ) as parallel:
            parallel.run(run_task, *task_args)
    return None


def _child_env(port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in WORLD_VARS}
    env["MASTER_PORT"] = str(port)
    env["MASTER_ADDR"] = "127.0.0.1"
    # Children write to a pipe; unbuffered, their lines reach the parent as they happen.
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _relay(stream, prefix: str) -> None:
    for line in stream:
        text = line.rstrip("\n")
        if not text.strip():
            continue  # a child's spacing line: prefixed, it only reads as a stray empty line
        # One write per line, so lines of concurrent children never interleave mid-line.
        sys.stdout.write(f"[{prefix}] {text}\n")
        sys.stdout.flush()


def _launching_line(path, port: int, extra_args: list) -> str:
    """``Launching: <path>``, with the rendezvous port only for a child that spawns ranks; a
    config that does not load here is the child's to report, so it gets the port too."""
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file

    overrides = [arg.removeprefix("--override=") for arg in extra_args]
    try:
        cfg = load_config_from_file(path)
        apply_overrides(cfg, overrides)
        nproc, nnodes, _node_rank = resolve_topology(cfg)
    except Exception:
        nproc = nnodes = 2
    port_note = f" (MASTER_PORT={port})" if nproc * nnodes > 1 else ""
    return f"Launching: {path}{port_note}"


def launch_many(
    config_paths: Sequence[Union[str, os.PathLike]], extra_args: Optional[list[str]] = None
) -> int:
    """Train each config as its own ``gatle-ignite train`` child; 0 when all succeed, else 1.

    The children run at once, each on its share of the machine (launch.budget).
    """
    extra_args = list(extra_args or [])
    ports = free_ports(len(config_paths))
    children = []
    for path, port, share in zip(config_paths, ports, shares(len(config_paths))):
        prefix = Path(path).stem
        print(_launching_line(path, port, extra_args), flush=True)
        command = [sys.executable, "-m", "gatle_ignite", "train", f"--config={path}", *extra_args]
        child = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=share.apply(_child_env(port)),
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
