"""Process launching: one config in this process (spawning workers), or several as children.

``torch.cuda.device_count``, ``idist.Parallel``, ``subprocess.Popen`` and ``run_task`` are used
through this module's attributes at call time, so users and tests can patch them.
"""

import contextlib
import gc
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional, Union

import ignite.distributed as idist
import torch
from ml_collections import config_dict

from gatle_ignite.dispatch import ConfigError, import_entrypoint
from gatle_ignite.trainer.preemption import EXIT_PREEMPTED, Preempted, preemption_signals

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
# Where each spawned rank leaves a mark once its run is done; see _teardown_crash_tolerated.
_FINISHED_DIR_VAR = "GATLE_IGNITE_FINISHED_DIR"


def run_task(local_rank: int, cfg: config_dict.ConfigDict, job: Optional[Callable] = None):
    """Build the config's ``Trainer`` and train it, or only evaluate it in inference mode.

    ``job(trainer)``, when given, runs instead of both: a tool such as ``predict``.
    """
    Trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    task = Trainer(local_rank, cfg)
    if job is not None:
        result = job(task)
    elif "run" in cfg:
        task.evaluate()
        result = task
    else:
        result = task.fit()
    if idist.get_world_size() == 1:
        return result
    _mark_finished(local_rank)
    # The trainer's DDP wrapper holds the process group: free it now, while every peer is
    # connected, not in a garbage collection after ignite destroyed the group.
    del task, result
    gc.collect()
    # ignite destroys each rank's process group as soon as it returns; a rank that gets there
    # first tears down connections a peer is still using, and gloo aborts it.
    idist.barrier()
    return None


def _mark_finished(local_rank: int) -> None:
    folder = os.environ.get(_FINISHED_DIR_VAR)
    if folder:
        Path(folder, f"local_rank{local_rank}").touch()


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


def _existing_world() -> Optional[str]:
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
def _hidden_from_ignite(*names: str):
    """Hide environment variables while ignite builds the world.

    ignite takes the SLURM path whenever SLURM_JOB_ID is set, which refuses the ranks that
    spawning assigns and conflicts with a torchrun world inside an allocation.
    """
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _warn_if_topology_ignored(cfg: config_dict.ConfigDict, world: str) -> None:
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


def _join(cfg: config_dict.ConfigDict, world: str, task_args: tuple) -> None:
    _warn_if_topology_ignored(cfg, world)
    hidden = () if world == "slurm" else ("SLURM_JOB_ID",)
    with _hidden_from_ignite(*hidden), idist.Parallel(backend=_resolve_backend(cfg)) as parallel:
        parallel.run(run_task, *task_args)


def launch(cfg: config_dict.ConfigDict, job: Optional[Callable] = None):
    """Run the config here: join a world torchrun or srun started, run directly for one
    process, or spawn this node's workers through ``idist.Parallel``.

    ``job``, a picklable ``job(trainer)``, replaces fit/evaluate on every rank (see run_task).
    """
    # Without a job the workers get exactly (cfg,), as before there were jobs.
    task_args = (cfg,) if job is None else (cfg, job)
    world = _existing_world()
    if world is not None:
        return _join(cfg, world, task_args)
    nproc, nnodes, node_rank = resolve_topology(cfg)
    addr, port = resolve_rendezvous(cfg, nnodes)
    os.environ["MASTER_PORT"] = str(port)
    os.environ["MASTER_ADDR"] = addr
    if nproc * nnodes <= 1:
        return run_task(0, *task_args)
    parallel_kwargs = _parallel_kwargs(nnodes, node_rank, addr, port)
    with (
        _hidden_from_ignite("SLURM_JOB_ID"),
        _ranks_preemptible(),
        _teardown_crash_tolerated(nproc),
    ):
        with idist.Parallel(
            backend=_resolve_backend(cfg), nproc_per_node=nproc, **parallel_kwargs
        ) as parallel:
            parallel.run(run_task, *task_args)
    return None


@contextlib.contextmanager
def _ranks_preemptible():
    """Pass preemption signals on to the spawned ranks, and report their agreed exit."""
    with preemption_signals(forward_to=multiprocessing.active_children):
        try:
            yield
        except torch.multiprocessing.ProcessExitedException as error:
            if error.exit_code != EXIT_PREEMPTED:
                raise
            raise Preempted(
                "the ranks were preempted and wrote a resumable checkpoint.\n"
                "  Run the same command with --override resume=True to continue."
            ) from None


@contextlib.contextmanager
def _teardown_crash_tolerated(nproc: int):
    """Report success when a rank dies only after every rank of this node finished the run.

    gloo can abort a process while torch tears its process group down at exit; by then every
    checkpoint and log line is written, so the run's outcome is success, not that signal.
    """
    with tempfile.TemporaryDirectory(prefix="gatle-ignite-ranks-") as folder:
        os.environ[_FINISHED_DIR_VAR] = folder
        try:
            yield
        except torch.multiprocessing.ProcessExitedException as error:
            if len(os.listdir(folder)) < nproc:
                raise
            how = error.signal_name or f"exit code {error.exit_code}"
            warnings.warn(
                f"rank {error.error_index} ended with {how} in torch's process-group teardown, "
                f"after every rank had finished the run: its checkpoints and logs are complete.",
                stacklevel=3,
            )
        finally:
            os.environ.pop(_FINISHED_DIR_VAR, None)


def _child_env(port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _INHERITED_WORLD_VARS}
    env["MASTER_PORT"] = str(port)
    env["MASTER_ADDR"] = "127.0.0.1"
    # Children write to a pipe; unbuffered, their lines reach the parent as they happen.
    env["PYTHONUNBUFFERED"] = "1"
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
