"""``gatle-ignite sweep``: a hyperparameter search on Optuna whose every trial is a run.

The flags and what the command prints; the search itself is ``gatle_ignite.sweep``. Nothing
heavy is imported until the command runs, so ``--help`` answers at once.
"""

import argparse
import sys

__all__ = ["add_sweep_parser", "run_sweep_command"]

_SPACES = "a list [a, b, ...], loguniform(low, high), uniform(low, high) or int(low, high)"


def add_sweep_parser(commands) -> None:
    """The ``sweep`` sub-command's flags; each, given, wins over the sweep file's field."""
    sweep = commands.add_parser(
        "sweep", help="search hyperparameters, each trial a run; resumable, pruned, parallel"
    )
    sweep.add_argument("--config", metavar="PATH", help="the config each trial trains")
    sweep.add_argument(
        "--sweep",
        metavar="FILE",
        help="a sweep file: a module whose get_sweep() returns the fields",
    )
    sweep.add_argument("--dir", metavar="DIR", help="the sweep directory: study and trials")
    sweep.add_argument("--trials", type=int, metavar="N", help="finish N trials in all")
    sweep.add_argument(
        "--param",
        action="append",
        default=[],
        dest="params",
        metavar="KEY=SPACE",
        help=f"a dotted config key and its space: {_SPACES}; repeatable",
    )
    sweep.add_argument(
        "--override",
        action="append",
        default=[],
        dest="overrides",
        metavar="KEY=VALUE",
        help="set a config field for every trial; repeatable",
    )
    sweep.add_argument("--workers", type=int, metavar="W", help="trials at once here (default 1)")
    sweep.add_argument(
        "--storage", metavar="URL", help="a shared study (postgresql://...); default a journal"
    )
    sweep.add_argument("--study", metavar="NAME", help="the study's name (default DIR's name)")
    sweep.add_argument("--sampler", metavar="tpe|random|grid", help="default tpe")
    sweep.add_argument("--pruner", metavar="median|hyperband|none", help="default median")
    sweep.add_argument("--metric", metavar="NAME", help="default the config's score_name")
    sweep.add_argument("--direction", metavar="maximize|minimize", help="default from score_factor")
    sweep.add_argument(
        "--max-failures",
        type=int,
        dest="max_failures",
        metavar="K",
        help="stop after K trials in a row failed (default 3; 0 never)",
    )
    sweep.add_argument(
        "--storage-retry",
        type=int,
        dest="storage_retry",
        metavar="S",
        help="while a --storage database does not answer, try again for S seconds (default 120)",
    )


def run_sweep_command(args: argparse.Namespace) -> int:
    """Check the sweep, run it, print how it ended and its best trial; the exit code."""
    from gatle_ignite.sweep.checks import check_sweep
    from gatle_ignite.sweep.definition import load_sweep_file, merge
    from gatle_ignite.sweep.runner import run_sweep

    fields = load_sweep_file(args.sweep) if args.sweep else None
    checked = check_sweep(merge(vars(args), fields))
    result = run_sweep(checked)
    print()
    # A sweep that stopped on failures says so where errors go; a finished or preempted one not.
    print(result.message, file=sys.stderr if result.exit_code == 1 else sys.stdout, flush=True)
    _print_best(result, checked)
    return result.exit_code


def _print_best(result, checked) -> None:
    from gatle_ignite.run.scores import LOWER_IS_BETTER
    from gatle_ignite.sweep.runner import best_trial
    from gatle_ignite.sweep.trial import param_override, shown_command, trial_dir, trial_overrides

    best = best_trial(result.study)
    if best is None:
        return
    sweep, record = checked.sweep, result.record
    params = {param.key: best.params[param.key] for param in sweep.params}
    overrides = trial_overrides(sweep, record.study, best.number, params)
    # Its own name, so that it trains beside the config's run rather than into it.
    again = param_override("name", f"{checked.config_name or record.study}_trial_{best.number}")
    as_config = [*sweep.overrides, again, *(param_override(k, v) for k, v in params.items())]
    lower = f" ({LOWER_IS_BETTER})" if record.direction == "minimize" else ""
    print(f"BEST: trial {best.number}, {record.metric} {best.value:.5g}{lower}")
    print(f"  params:   {', '.join(param_override(k, v) for k, v in params.items())}")
    print(f"  run:      {trial_dir(sweep.dir, best.number)}")
    print(f"  evaluate: {shown_command('eval', sweep.config, overrides, '--ckpt', 'best')}")
    print(f"  train it again as a config: {shown_command('train', sweep.config, as_config)}")
