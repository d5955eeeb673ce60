"""The ``gatle-ignite`` command line: init, train, eval, config, status and the tools."""

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Optional

from gatle_ignite import __version__
from gatle_ignite.dispatch import ConfigError, report_config_error
from gatle_ignite.utils.warning_lines import show_framework_warnings_plainly

__all__ = ["build_parser", "main", "report_config_error"]

# Heavy modules (torch, ignite, the config checks) are imported inside the commands, so
# `--version`, `--help` and argument errors answer at once.

_DESCRIPTION = """\
A config-driven training framework for PyTorch, built on PyTorch-Ignite.

usage forms:
  gatle-ignite init NAME [--dir DIR] [--force]
  gatle-ignite train --config=CFG.py[,CFG2.py...] [--override KEY=VALUE]...
  gatle-ignite eval --config=CFG.py [--ckpt best|latest|PATH] [--override KEY=VALUE]...
  gatle-ignite config --config=CFG.py[,CFG2.py...] [--dry-run] [--all] [--override KEY=VALUE]...
  gatle-ignite status SAVE_DIR
  gatle-ignite runs DIR [DIR ...] [--all] [--csv] [--provenance]
  gatle-ignite sweep --config=CFG.py --dir DIR --trials N --param KEY=SPACE... [--workers W]
  gatle-ignite predict --config=CFG.py --out FILE [--ckpt best|latest|PATH] [--split SPLIT]
                       [--with-targets]
  gatle-ignite export --config=CFG.py --format safetensors|pt2|onnx --out DIR
                      [--ckpt best|latest|PATH] [--weights eval|raw] [--dynamic KEY=DIM,...]
                      [--force]
  gatle-ignite lr-find --config=CFG.py [--start-lr LR] [--end-lr LR] [--num-iter N] [--out PNG]
  gatle-ignite plot DIR [DIR ...] --out FILE.png [--best K] [--metrics PATTERN...]
                    [--x iteration|epoch|samples|tokens] [--perf]
  gatle-ignite consolidate SRC.dcp OUT.pt
"""


def _add_config_args(parser: argparse.ArgumentParser, config_help: str) -> None:
    parser.add_argument("--config", required=True, metavar="PATHS", help=config_help)
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an existing config field (dotted keys reach nested fields); repeatable",
    )


def _checkpoint_choice(value: str) -> str:
    from gatle_ignite.run.storage import is_url

    if value in ("best", "latest") or os.path.exists(value) or is_url(value):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r} is neither 'best', 'latest' nor an existing checkpoint file"
    )


def _add_checkpoint_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ckpt",
        default="best",
        type=_checkpoint_choice,
        metavar="best|latest|PATH",
        help="the best checkpoint, the furthest-trained one, or a checkpoint file",
    )


def _positive(value: str) -> int:
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")


def _add_tool_parsers(commands) -> None:
    from gatle_ignite.cli.export import add_export_arguments
    from gatle_ignite.cli.lr_find import DEFAULT_END_LR, DEFAULT_NUM_ITER, DEFAULT_START_LR

    predict = commands.add_parser(
        "predict", help="write the model's outputs for every sample of a split, in order"
    )
    _add_config_args(predict, "one config file")
    _add_checkpoint_arg(predict)
    predict.add_argument("--split", default="valid", help="an evaluation split (default valid)")
    predict.add_argument(
        "--out", required=True, metavar="FILE", help="where to torch.save {key: tensor[N, ...]}"
    )
    predict.add_argument(
        "--with-targets",
        action="store_true",
        help="also write prep_batch's targets (targets.<key>) and each row's sample index (index)",
    )

    export = commands.add_parser(
        "export", help="write the model as safetensors, a torch.export program or ONNX, checked"
    )
    _add_config_args(export, "one config file")
    _add_checkpoint_arg(export)
    add_export_arguments(export)

    lr_find = commands.add_parser(
        "lr-find",
        help="a learning-rate range test: prints a suggested learning rate and writes the "
        "loss-vs-lr plot (a PNG, default <save_dir>/lr_find.png); no checkpoint",
    )
    _add_config_args(lr_find, "one config file")
    lr_find.add_argument(
        "--start-lr",
        type=float,
        default=DEFAULT_START_LR,
        metavar="LR",
        help="the first learning rate tried (default %(default)g)",
    )
    lr_find.add_argument(
        "--end-lr",
        type=float,
        default=DEFAULT_END_LR,
        metavar="LR",
        help="the last learning rate tried (default %(default)g)",
    )
    lr_find.add_argument(
        "--num-iter",
        type=int,
        default=DEFAULT_NUM_ITER,
        metavar="N",
        help="training batches, one learning rate each (default %(default)s)",
    )
    lr_find.add_argument(
        "--out", metavar="PNG", help="the loss-vs-lr plot (default <save_dir>/lr_find.png)"
    )

    plot = commands.add_parser("plot", help="draw runs' metrics.csv curves, one panel per metric")
    plot.add_argument(
        "run_dirs", nargs="+", metavar="DIR", help="a run's save_dir, a folder of runs or a sweep"
    )
    plot.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write")
    plot.add_argument(
        "--best", type=_positive, metavar="K", help="draw only the K runs with the best score"
    )
    plot.add_argument(
        "--metrics",
        nargs="+",
        metavar="PATTERN",
        help="draw only the metrics these shell patterns match ('valid/*', 'train/loss*')",
    )
    plot.add_argument(
        "--x",
        choices=("iteration", "epoch", "samples", "tokens"),
        default="iteration",
        help="the x axis: the global iteration (default), the epoch, or the samples or "
        "tokens taken in, which puts runs of other batch sizes or world sizes on one axis",
    )
    plot.add_argument(
        "--perf",
        action="store_true",
        help="also draw the perf/ metrics, in a figure of their own: <out>_perf.png",
    )
    plot.add_argument(
        "--storage",
        metavar="URL",
        help="a sweep's database URL with its credentials, which its record leaves out",
    )

    runs = commands.add_parser(
        "runs", help="compare runs: one line each, the best score first, a table per score"
    )
    runs.add_argument(
        "dirs", nargs="+", metavar="DIR", help="a run's save_dir, a folder of runs or a sweep"
    )
    runs.add_argument(
        "--all",
        action="store_true",
        dest="everything",
        help="every differing field by its dotted key, and the paths, whatever the width",
    )
    runs.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    runs.add_argument(
        "--provenance",
        action="store_true",
        help="add how each run was made: commit, versions, host, world size, command",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser behind ``gatle-ignite``."""
    parser = argparse.ArgumentParser(
        prog="gatle-ignite",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gatle-ignite {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    init = commands.add_parser("init", help="write a new project skeleton")
    init.add_argument("name", help="project name (a valid python identifier)")
    init.add_argument("--dir", dest="directory", default=".", help="parent directory")
    init.add_argument("--force", action="store_true", help="overwrite existing files")

    train = commands.add_parser("train", help="train one config, or several in parallel")
    _add_config_args(train, "config file, or comma-separated files to run in parallel")
    train.add_argument(
        "--profile",
        action="store_true",
        help="profile a few training steps (profile=True): a trace in <save_dir>/profile/",
    )

    evaluate = commands.add_parser("eval", help="load a checkpoint and evaluate it")
    _add_config_args(evaluate, "one config file")
    _add_checkpoint_arg(evaluate)

    status = commands.add_parser(
        "status",
        help="show a run directory's state; exit 0 finished, 75 resumable, 1 failed, 65 diverged",
    )
    status.add_argument("save_dir", help="the run's save_dir")

    merge = commands.add_parser(
        "consolidate", help="write a sharded .dcp checkpoint as one ordinary .pt file"
    )
    merge.add_argument("source", metavar="SRC.dcp", help="a sharded checkpoint directory")
    merge.add_argument("out", metavar="OUT.pt", help="the file to write")

    check = commands.add_parser(
        "config", help="print what a config sets apart from the defaults, and check it, untrained"
    )
    _add_config_args(check, "config file, or comma-separated files")
    check.add_argument(
        "--dry-run",
        action="store_true",
        help="also run one batch of every split through prep_batch, the model, loss and metrics "
        "(the config itself is not printed)",
    )
    check.add_argument(
        "--all", action="store_true", help="print every field, not only those that differ"
    )
    _add_tool_parsers(commands)
    from gatle_ignite.cli.sweep import add_sweep_parser

    add_sweep_parser(commands)
    return parser


def _split_paths(value: str) -> list[str]:
    paths = [piece.strip() for piece in value.split(",") if piece.strip()]
    if not paths:
        raise ConfigError(f"--config {value!r} names no config file")
    return paths


def _ensure_cwd_importable() -> None:
    # A console script does not put the working directory on sys.path, yet configs name
    # dotted paths relative to it.
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)


def _prepare(args: argparse.Namespace, path: str):
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file, require_config
    from gatle_ignite.config.validate import validate_config

    _ensure_cwd_importable()
    cfg = require_config(load_config_from_file(path), path)
    apply_overrides(cfg, args.override)
    validate_config(cfg)
    return cfg


def _check_components(cfg) -> None:
    """The pre-flight: every mistake the config alone shows, before a run directory is touched
    or a job waits in a queue."""
    from gatle_ignite.config.preflight import preflight

    preflight(cfg)


def _check_configs(args: argparse.Namespace, paths: list[str]) -> int:
    from gatle_ignite.cli.config_text import config_text

    for path in paths:
        print(f"===== {path} =====")
        cfg = _prepare(args, path)
        if args.all or not args.dry_run:
            print(config_text(cfg, every_field=args.all))
        _check_components(cfg)
        print()
        print("all dotted paths resolve.")
        if args.dry_run:
            from gatle_ignite.cli.dry_run import dry_run

            dry_run(cfg)
    return 0


def _one_path(command: str, paths: list[str]) -> str:
    if len(paths) > 1:
        raise ConfigError(
            f"{command} takes one --config, got {len(paths)}: {', '.join(paths)}\n"
            f"  The comma form runs several configs in parallel and is for `train` only."
        )
    return paths[0]


def _evaluate(args: argparse.Namespace, paths: list[str]) -> int:
    from gatle_ignite.launch import launcher

    cfg = _prepare(args, _one_path("eval", paths))
    cfg.run = True
    cfg.load_from_ckpt = args.ckpt
    launcher.launch(cfg)
    return 0


def _train(args: argparse.Namespace, paths: list[str]) -> int:
    from gatle_ignite.launch import launcher

    if args.profile:
        args.override.append("profile=True")
    if len(paths) > 1:
        # Each child loads and validates its own config; the parent only fans out.
        return launcher.launch_many(paths, [f"--override={item}" for item in args.override])
    from gatle_ignite.cli.summary import end_of_run, last_recorded
    from gatle_ignite.utils.train_command import train_command

    cfg = _prepare(args, paths[0])
    _check_components(cfg)
    before = last_recorded(cfg.save_dir)
    with train_command():
        launcher.launch(cfg)
    if _trained_beside_another_run(cfg, before, last_recorded(cfg.save_dir)):
        print(f"TRAINING COMPLETE, nothing recorded: {cfg.save_dir} holds another run.")
        return 0
    return end_of_run(cfg, paths[0], args.override, time.monotonic() - args.started)


def _trained_beside_another_run(cfg, before, after) -> bool:
    """A run saving nothing (save_ckpt=False) beside the run in its save_dir, whose record it
    left as it was (``before`` and ``after`` are that record's bytes)."""
    saves_nothing = not cfg.get("save_ckpt", True) and not cfg.get("replace_run", False)
    return saves_nothing and before is not None and after == before


def _predict(args: argparse.Namespace, paths: list[str]) -> int:
    from gatle_ignite.cli.predict import predict

    cfg = _prepare(args, _one_path("predict", paths))
    predict(cfg, args.split, args.out, args.ckpt, with_targets=args.with_targets)
    return 0


def _export(args: argparse.Namespace, paths: list[str]) -> int:
    from gatle_ignite.cli.export import run_export

    return run_export(_prepare(args, _one_path("export", paths)), args)


def _lr_find(args: argparse.Namespace, paths: list[str]) -> int:
    from gatle_ignite.cli.lr_find import run_lr_find

    cfg = _prepare(args, _one_path("lr-find", paths))
    run_lr_find(cfg, args.out, args.start_lr, args.end_lr, args.num_iter)
    return 0


_CONFIG_COMMANDS = {
    "config": _check_configs,
    "eval": _evaluate,
    "train": _train,
    "predict": _predict,
    "lr-find": _lr_find,
    "export": _export,
}


def _run_command(args: argparse.Namespace) -> int:
    if args.command == "init":
        from gatle_ignite.cli.init import init_project

        return init_project(args.name, args.directory, args.force)
    if args.command == "status":
        from gatle_ignite.cli.status import run_status

        return run_status(args.save_dir)
    if args.command == "consolidate":
        from gatle_ignite.cli.consolidate import consolidate

        return consolidate(args.source, args.out)
    if args.command == "plot":
        from gatle_ignite.cli.plot import run_plot

        return run_plot(
            args.run_dirs,
            args.out,
            best=args.best,
            storage=args.storage,
            metrics=args.metrics,
            x=args.x,
            perf=args.perf,
        )
    if args.command == "runs":
        from gatle_ignite.cli.runs import run_runs

        return run_runs(
            args.dirs, as_csv=args.csv, provenance=args.provenance, everything=args.everything
        )
    if args.command == "sweep":
        from gatle_ignite.cli.sweep import run_sweep_command

        _ensure_cwd_importable()
        return run_sweep_command(args)
    return _CONFIG_COMMANDS[args.command](args, _split_paths(args.config))


def _show_tracebacks_redacted() -> None:
    """An exception that leaves ``main``, or ends one of its threads, has its traceback printed
    without the credentials of the URLs in it (a dataset's, a tracking server's)."""
    from gatle_ignite.redaction import redacted_excepthook, redacted_thread_excepthook

    sys.excepthook = redacted_excepthook
    threading.excepthook = redacted_thread_excepthook


def _process_age() -> float:
    """Wall seconds since this process started, from ``/proc`` (Linux); 0.0 where it cannot
    be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # After the name, which may hold spaces and parentheses: starttime is the 20th.
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as uptime:
            since_boot = float(uptime.read().split()[0])
        return max(since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def _stdout_closed() -> int:
    """End as a Unix tool ends when the reader of its output went away (``runs | head -1``):
    quietly, with the status of a process that SIGPIPE ended."""
    # Whatever is still buffered for the closed pipe would fail again at exit, loudly.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    from gatle_ignite.run.storage import StorageError
    from gatle_ignite.trainer.preemption import EXIT_INTERRUPTED, Interrupted, Preempted

    # What the command cost counts from the process's start, the interpreter and the imports
    # included, when it is the process (`gatle-ignite ...`); called from other code, from here.
    started = time.monotonic() - (_process_age() if argv is None else 0.0)
    args = build_parser().parse_args(argv)
    args.started = started
    show_framework_warnings_plainly()
    _show_tracebacks_redacted()
    try:
        code = _run_command(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except ConfigError as error:
        report_config_error(error)
        return 2
    except (Preempted, Interrupted) as stopped:
        # Already said; the exit code tells a scheduler or a script to run it again.
        return stopped.code
    except StorageError as error:
        # An object store that stopped answering: what is safe where is in the message.
        from gatle_ignite.redaction import redact_text

        print(f"storage error: {redact_text(str(error))}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C outside training (loading, building, evaluating): nothing to save.
        print("interrupted by SIGINT.", file=sys.stderr)
        return EXIT_INTERRUPTED
