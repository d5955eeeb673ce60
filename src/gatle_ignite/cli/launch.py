"""Process launching: one config in this process (spawning workers), or several as children.

``torch.cuda.device_count``, ``idist.Parallel``, ``subprocess.Popen`` and ``run_task`` are used
through this module's attributes at call time, so users and tests can patch them.
"""

import contextlib
import datetime
import gc
import multiprocessing
import os
import random
import re
import signal
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

from gatle_ignite.cli.warning_lines import show_framework_warnings_plainly
from gatle_ignite.dispatch import ConfigError, import_entrypoint
from gatle_ignite.trainer.preemption import (
    EXIT_PREEMPTED,
    Preempted,
    preemption_signals,
    signal_name,
)
from gatle_ignite.utils.dist import quiet_ignite_loggers

__all__ = [
    "EXIT_PEER_TIMEOUT",
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
# Where each spawned rank leaves a mark of how its run ended; see _RankMarks.
_MARKS_DIR_VAR = "GATLE_IGNITE_RANK_MARKS_DIR"
# sysexits' EX_UNAVAILABLE: a rank's peers stopped answering; the rank that waited says so.
EXIT_PEER_TIMEOUT = 69
# The CLI's code for a config error, which a spawned rank reports itself, without a traceback.
EXIT_CONFIG_ERROR = 2
# What gloo and NCCL say when a collective outlives the process group's timeout.
_COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting|collective operation timeout")
# After a rank fails, the time torch's join gets to name that rank as the one to report, before
# the launcher kills the rest; a rank killed first could be reported instead.
_REPORT_GRACE_S = 1.0


def run_task(local_rank: int, cfg: config_dict.ConfigDict, job: Optional[Callable] = None):
    """Build the config's ``Trainer`` and train it, or only evaluate it in inference mode.

    ``job(trainer)``, when given, runs instead of both: a tool such as ``predict``. Returns the
    task (what ``fit()`` returns), or the job's result, on every rank; under DDP the task's
    ``model`` is then the unwrapped module.
    """
    if os.environ.get(_MARKS_DIR_VAR) is not None:
        show_framework_warnings_plainly()  # a rank the CLI spawned, as the CLI shows them
    Trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    task = Trainer(local_rank, cfg)
    with _peer_timeout_reported(cfg):
        result = _run_and_mark(task, cfg, local_rank, job)
        if idist.get_world_size() > 1:
            _release_process_group(task)
            # ignite destroys each rank's process group as soon as it returns; a rank that gets
            # there first tears down connections a peer is still using, and gloo aborts it.
            idist.barrier()
    return result


def _run_and_mark(task, cfg: config_dict.ConfigDict, local_rank: int, job=None):
    try:
        if job is not None:
            result = job(task)
        elif "run" in cfg:
            task.evaluate()
            result = task
        else:
            result = task.fit()
    except Preempted:
        _RankMarks.leave("preempted", local_rank)
        raise
    except ConfigError as error:
        if os.environ.get(_MARKS_DIR_VAR) is None:
            raise  # this process is the CLI's: it reports the error
        # A spawned rank: torch would print its traceback; the fix is what the user needs.
        _RankMarks.leave("config_error", local_rank)
        if idist.get_rank() == 0:
            from gatle_ignite.cli.main import report_config_error

            report_config_error(error)
        raise SystemExit(EXIT_CONFIG_ERROR) from None
    _RankMarks.leave("finished", local_rank)
    return result


def _release_process_group(task) -> None:
    """Unwrap the task's DDP model and strip the wrapper of what holds the process group.

    Freed only in a garbage collection after ignite destroyed the group, the wrapper's hold
    made gloo abort the rank. Checkpoint handlers keep the wrapper itself, so unwrapping alone
    would not free it.
    """
    model = getattr(task, "model", None)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        task.model = model.module
        for name in ("reducer", "logger", "process_group"):
            model.__dict__.pop(name, None)
    # Garbage that still holds the group (a wrapper in a reference cycle) goes now, while every
    # peer is connected.
    gc.collect()


@contextlib.contextmanager
def _peer_timeout_reported(cfg: config_dict.ConfigDict):
    """End the process with one message on stderr and ``EXIT_PEER_TIMEOUT`` when a collective
    timed out."""
    try:
        yield
    except RuntimeError as error:
        if not _COLLECTIVE_TIMEOUT.search(str(error)):
            raise
        print(_peer_timeout_message(cfg), file=sys.stderr, flush=True)
        sys.stdout.flush()
        # A group whose collective timed out cannot be torn down: gloo aborts the process in
        # its destructors. The trainer closed its backends when the error left fit().
        os._exit(EXIT_PEER_TIMEOUT)


def _peer_timeout_message(cfg: config_dict.ConfigDict) -> str:
    seconds = cfg.get("dist_timeout", None)
    limit = f"dist_timeout={seconds} s" if seconds else "torch's default (dist_timeout unset)"
    return (
        f"distributed timeout: rank {idist.get_rank()} waited more than {limit} for its peers "
        f"in a collective: a peer is stalled or dead, so the run stops "
        f"(exit code {EXIT_PEER_TIMEOUT}).\n"
        f"  Raise dist_timeout if a rank can legitimately work alone that long (a long "
        f"evaluation or checkpoint write on one rank); --override resume=True continues from "
        f"the last checkpoint."
    )


def _dist_timeout(cfg: config_dict.ConfigDict) -> Optional[datetime.timedelta]:
    seconds = cfg.get("dist_timeout", None)
    return datetime.timedelta(seconds=seconds) if seconds else None


class _RankMarks:
    """A folder where each rank this launcher spawned marks how its run ended.

    ``finished-<local rank>`` once its run is done, ``preempted-<local rank>`` once it saved
    its preemption checkpoint, ``config_error-<local rank>`` when it stops on a config error; a
    rank that ends with none of them failed.
    """

    def __init__(self, folder: str):
        self.folder = folder

    @staticmethod
    def leave(outcome: str, local_rank: int) -> None:
        folder = os.environ.get(_MARKS_DIR_VAR)
        if folder:
            Path(folder, f"{outcome}-{local_rank}").touch()

    def count(self, *outcomes: str) -> int:
        return sum(name.split("-")[0] in outcomes for name in os.listdir(self.folder))

    @classmethod
    @contextlib.contextmanager
    def exported(cls):
        """A fresh folder, named to the ranks through the environment they inherit."""
        with tempfile.TemporaryDirectory(prefix="gatle-ignite-ranks-") as folder:
            os.environ[_MARKS_DIR_VAR] = folder
            try:
                yield cls(folder)
            finally:
                os.environ.pop(_MARKS_DIR_VAR, None)


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
        _apply_dist_timeout(cfg)
        parallel.run(run_task, *task_args)


def _apply_dist_timeout(cfg: config_dict.ConfigDict) -> None:
    """Give a joined world's process group the config's timeout.

    ignite's Parallel passes a timeout to the ranks it spawns, but none to a group it only
    joins, so the group gets it once made.
    """
    timeout = _dist_timeout(cfg)
    if timeout is not None:
        torch.distributed.distributed_c10d._set_pg_timeout(timeout)


def launch(cfg: config_dict.ConfigDict, job: Optional[Callable] = None):
    """Run the config here: join a world torchrun or srun started, run directly for one
    process, or spawn this node's workers through ``idist.Parallel``.

    ``job``, a picklable ``job(trainer)``, replaces fit/evaluate on every rank (see run_task).
    """
    quiet_ignite_loggers(cfg.get("verbosity", 1))
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
    timeout = _dist_timeout(cfg)
    if timeout is not None:
        # ignite hands it on to every spawned rank's init_process_group.
        parallel_kwargs["timeout"] = timeout
    with (
        _hidden_from_ignite("SLURM_JOB_ID"),
        _RankMarks.exported() as marks,
        _ranks_supervised(nproc, marks),
        _teardown_crash_tolerated(nproc, marks),
    ):
        with idist.Parallel(
            backend=_resolve_backend(cfg), nproc_per_node=nproc, **parallel_kwargs
        ) as parallel:
            parallel.run(run_task, *task_args)
    return None


@contextlib.contextmanager
def _ranks_supervised(nproc: int, marks: _RankMarks):
    """Pass preemption signals on to the spawned ranks, and report how the ranks ended.

    A second signal kills the ranks: the first only asks them to stop at the end of an
    iteration, which a stalled rank never reaches.
    """
    killed_by = []

    def kill_ranks(signum) -> None:
        killed_by.append(signum)
        _kill(multiprocessing.active_children())

    with (
        preemption_signals(forward_to=multiprocessing.active_children, on_repeat=kill_ranks),
        _failed_rank_ends_the_node(nproc, marks),
    ):
        try:
            yield
        except torch.multiprocessing.ProcessExitedException as error:
            if killed_by:
                raise SystemExit(_killed_message(killed_by[0])) from None
            if marks.count("config_error"):
                # Whichever rank torch names (one may abort in gloo's teardown as it exits),
                # the run ended on a config error, which rank 0 has printed.
                raise SystemExit(EXIT_CONFIG_ERROR) from None
            if error.exit_code == EXIT_PREEMPTED or marks.count("preempted") == nproc:
                # Every rank saved and stopped; one may have aborted in gloo's teardown after.
                raise Preempted(
                    "the ranks were preempted and wrote a resumable checkpoint.\n"
                    "  Run the same command with --override resume=True to continue."
                ) from None
            if error.exit_code in (EXIT_PEER_TIMEOUT, EXIT_CONFIG_ERROR):
                # The rank has said why; a traceback here would only repeat it.
                raise SystemExit(error.exit_code) from None
            raise


def _killed_message(signum) -> str:
    return (
        f"stopped by a second {signal_name(signum)}: the ranks had not stopped after the "
        f"first, so they were killed, without a preemption checkpoint.\n"
        f"  --override resume=True continues from the last checkpoint written before."
    )


@contextlib.contextmanager
def _failed_rank_ends_the_node(nproc: int, marks: _RankMarks):
    """Kill this node's ranks soon after one of them ends without finishing or a preemption.

    Its peers can only wait for it in their next collective, or, stalled, never get there;
    torch's join would send them SIGTERM, which a rank takes as a preemption request, and
    kill them 30 s later.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    timers = []

    def on_child_exit(_signum, _frame) -> None:
        running = [p for p in multiprocessing.active_children() if _still_running(p.pid)]
        if timers or nproc - len(running) <= marks.count("finished", "preempted"):
            return
        timer = threading.Timer(_REPORT_GRACE_S, _kill, args=(running,))
        timer.daemon = True
        timer.start()
        timers.append(timer)

    previous = signal.signal(signal.SIGCHLD, on_child_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)
        for timer in timers:
            timer.cancel()


def _still_running(pid: int) -> bool:
    """Whether a child still exists, asked of the system.

    The handler can run while torch's join is reaping that child, before multiprocessing has
    recorded its end, so multiprocessing would still count it as running.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(processes) -> None:
    for process in processes:
        process.kill()


@contextlib.contextmanager
def _teardown_crash_tolerated(nproc: int, marks: _RankMarks):
    """Report success when a rank dies only after every rank of this node finished the run.

    gloo can abort a process while torch tears its process group down at exit; by then every
    checkpoint and log line is written, so the run's outcome is success, not that signal.
    """
    try:
        yield
    except torch.multiprocessing.ProcessExitedException as error:
        if marks.count("finished") < nproc:
            raise
        how = error.signal_name or f"exit code {error.exit_code}"
        warnings.warn(
            f"rank {error.error_index} ended with {how} in torch's process-group teardown, "
            f"after every rank had finished the run: its checkpoints and logs are complete.",
            stacklevel=3,
        )


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
