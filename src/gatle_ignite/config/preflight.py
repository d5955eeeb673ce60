"""The pre-flight: every mistake ``train`` would stop at before its first iteration that the
config alone shows, found before anything is built or any file is created.

``gatle-ignite config`` and ``gatle-ignite train`` both run it, so they give a config the same
verdict. What needs a batch (the metrics the engines really produce) is the dry run's.
"""

from gatle_ignite.callbacks.logging import BUILTIN_BACKENDS, check_extra_installed
from gatle_ignite.config.construction import construction_problems
from gatle_ignite.config.keywords import keyword_problems
from gatle_ignite.config.validate import check_dispatch
from gatle_ignite.dispatch import ConfigError, import_entrypoint, import_module_from_path
from gatle_ignite.enhancements.early_stop import early_stop_settings, unbuilt_engine_error
from gatle_ignite.launch.world import resolve_topology
from gatle_ignite.specs import EVAL_SPECS
from gatle_ignite.trainer.base import BaseTrainer
from gatle_ignite.trainer.checkpointing import check_warm_start
from gatle_ignite.trainer.checks import score_refusal

__all__ = ["preflight"]

# Overriding any of these changes which engines exist or which metrics they carry.
_METRIC_METHODS = ("eval_specs", "attach_metrics", "init_metrics", "dict_metric_from_list")


def preflight(cfg) -> None:
    """Refuse the config for every mistake ``train`` would meet before its first iteration.

    Dotted paths that do not import and missing extras are reported first, on their own; then
    every other mistake at once, the values the built-in components refuse when constructed
    (config.construction) once their keywords are right.
    """
    check_dispatch(cfg)
    for backend in cfg.get("logger_name", None) or ():
        check_extra_installed(backend)
    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")

    def builds(method: str) -> bool:
        return getattr(trainer_cls, method, None) is getattr(BaseTrainer, method)

    problems = keyword_problems(cfg, builds)
    if not problems:
        # Values once the keywords are right: a misspelt keyword would fail every build.
        problems += construction_problems(cfg, builds)
    if all(builds(method) for method in _METRIC_METHODS):
        problems += _score_problems(cfg)
    if builds("eval_specs"):
        problems += _early_stop_problems(cfg)
    problems += _builtin_problems(cfg, builds)
    problems += _topology_problems(cfg)
    problems += _warm_start_problems(cfg)
    if problems:
        listed = "\n".join(f"  - {_indented(problem)}" for problem in problems)
        raise ConfigError(
            f"{len(problems)} mistake(s) that `train` would stop at before its first "
            f"iteration:\n{listed}"
        )


def _indented(problem: str) -> str:
    """A problem's later lines under its first, which the list item starts."""
    first, *rest = problem.splitlines()
    return "\n".join([first, *(f"    {line.removeprefix('  ')}" for line in rest)])


def _is_built(spec, cfg) -> bool:
    """Whether training builds ``spec``'s engine: its split has data and its cadence is on."""
    every = cfg.get(spec.every_field, 0) if spec.every_field else 1
    return bool(cfg.get(f"{spec.split}_ds_name", None)) and isinstance(every, int) and every > 0


def _score_problems(cfg) -> list:
    """Score names no engine produces, where the metrics are the config's own mappings."""
    problems = []
    for spec in EVAL_SPECS:
        score_name = cfg.get(spec.score_field, None)
        metrics = cfg.get(spec.metrics_field, None) or {}
        if not isinstance(score_name, str) or not score_name or not _is_built(spec, cfg):
            continue
        if spec.with_losses or not hasattr(metrics, "keys"):
            continue  # loss names depend on the built criterion; a bad mapping is refused
        names = [f"{spec.engine_type}/{key}" for key in metrics.keys()]
        refusal = score_refusal(spec, score_name, names)
        if refusal is not None:
            problems.append(refusal)
    return problems


def _said(check, *args) -> list:
    """``[its message]`` when ``check(*args)`` raises a config error, else ``[]``."""
    try:
        check(*args)
    except ConfigError as error:
        return [str(error)]
    return []


def _early_stop_problems(cfg) -> list:
    problems = []
    for spec in EVAL_SPECS:
        refused = _said(early_stop_settings, spec, cfg)
        if not refused and early_stop_settings(spec, cfg) and not _is_built(spec, cfg):
            refused = [str(unbuilt_engine_error(spec, cfg))]
        problems += refused
    return problems


def _builtin_problems(cfg, builds) -> list:
    """What the framework's own components the config names would refuse when built, asked of
    each one that can tell from the config alone (its ``check_config``)."""
    paths = [
        f"gatle_ignite.callbacks.backends.{name}"
        for name in cfg.get("logger_name", None) or ()
        if name in BUILTIN_BACKENDS
    ]
    scheduler = cfg.get("lr_scheduler", None)
    if scheduler and builds("build_scheduler") and builds("eval_specs"):
        paths.append(scheduler)
    problems = []
    for path in (path for path in paths if path.startswith("gatle_ignite.")):
        check = getattr(import_module_from_path(path), "check_config", None)
        problems += _said(check, cfg) if check is not None else []
    return problems


def _warm_start_problems(cfg) -> list:
    return _said(check_warm_start, cfg) if cfg.get("model_checkpoint_dir", None) else []


def _topology_problems(cfg) -> list:
    try:
        return _said(resolve_topology, cfg)
    except (TypeError, ValueError) as error:
        return [f"nnodes, node_rank and nproc_per_node must be whole numbers ({error})."]
