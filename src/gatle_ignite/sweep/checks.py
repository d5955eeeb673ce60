"""Everything about a sweep that can be checked before its first trial, checked then.

The config with the sweep's overrides loads, validates and passes ``train``'s pre-flight; every
parameter's key exists and every value its space can give (each choice, both ends of a range)
is accepted by the config and the pre-flight (a params mapping's keywords included), set exactly
as the trials will set it; the metric and its direction are known. A
mistake is a config error naming it, and nothing has been created yet.
"""

import copy
from dataclasses import dataclass
from pathlib import Path

from ml_collections import config_dict

from gatle_ignite.config.loader import apply_overrides, load_config_from_file
from gatle_ignite.config.preflight import preflight
from gatle_ignite.config.validate import validate_config
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.redaction import config_payload, redact_argv
from gatle_ignite.run.identity import fingerprint
from gatle_ignite.run.storage import local_dir
from gatle_ignite.sweep.definition import Sweep, check_grid, enqueued_trials
from gatle_ignite.sweep.record import RECORD_FILE, SweepRecord
from gatle_ignite.sweep.remote import fetch_sweep_files
from gatle_ignite.sweep.study import (
    JOURNAL_FILE,
    build_pruner,
    direction_of,
    require_optuna,
    shown_storage,
    where_stored,
)
from gatle_ignite.sweep.trial import TRIAL_PREFIX, param_override

__all__ = ["Checked", "check_sweep"]

# Fields each trial gets from the sweep itself.
_SET_BY_THE_SWEEP = ("save_dir", "name", "resume", "replace_run")


@dataclass(frozen=True)
class Checked:
    """A sweep that passed every check: its definition, config and record."""

    sweep: Sweep
    config_name: str
    record: SweepRecord
    storage: dict
    enqueued: list


def check_sweep(sweep: Sweep) -> Checked:
    """Check ``sweep`` as far as it can be checked without running a trial."""
    require_optuna()
    sweep = check_grid(sweep)
    cfg = _load(sweep.config, sweep.overrides)
    preflight(cfg)
    for param in sweep.params:
        _check_param(cfg, sweep, param)
    enqueued = enqueued_trials(sweep)
    metric, direction = _metric(cfg, sweep)
    build_pruner(sweep.pruner, sweep.pruner_params)
    fetch_sweep_files(sweep.dir)
    storage = where_stored(local_dir(sweep.dir), sweep.storage)
    record = SweepRecord.new(
        study=sweep.study or _default_study(sweep.dir),
        storage=shown_storage(storage) if sweep.storage else JOURNAL_FILE,
        config=sweep.config,
        config_fingerprint=fingerprint(config_payload(cfg)),
        overrides=redact_argv(sweep.overrides),  # a secret's value does not define a sweep
        params={param.key: param.text() for param in sweep.params},
        metric=metric,
        direction=direction,
        trials=sweep.trials,
        sampler=sweep.sampler,
        pruner=sweep.pruner,
        pruner_params=dict(sweep.pruner_params),
    )
    check_directory(local_dir(sweep.dir), record)
    return Checked(sweep, str(cfg.get("name", "") or ""), record, storage, enqueued)


def _load(path: str, overrides) -> config_dict.ConfigDict:
    cfg = load_config_from_file(path)
    apply_overrides(cfg, overrides)
    validate_config(cfg)
    return cfg


def _check_param(cfg, sweep: Sweep, param) -> None:
    if param.key.split(".")[0] in _SET_BY_THE_SWEEP:
        raise ConfigError(
            f"--param {param.key}: the sweep sets {param.key.split('.')[0]} for each trial itself"
        )
    for value in param.probes():
        trial_cfg = copy.deepcopy(cfg)
        try:
            apply_overrides(trial_cfg, [param_override(param.key, value)])
            validate_config(trial_cfg)
            preflight(trial_cfg)
        except ConfigError as error:
            raise ConfigError(
                f"--param {param.key}={param.text()}: the value {value!r} cannot be used:\n"
                f"  {error}"
            ) from None


def _metric(cfg, sweep: Sweep) -> tuple:
    score_name = cfg.get("score_name", None)
    metric = sweep.metric or score_name
    if not metric:
        raise ConfigError(
            "the config has no score_name, so the sweep does not know what to optimise.\n"
            "  Set score_name in the config, or give --metric NAME and --direction."
        )
    direction = sweep.direction
    if direction is None:
        if metric != score_name:
            raise ConfigError(
                f"--metric {metric} is not the config's score_name ({score_name!r}), so its "
                f"direction is unknown.\n  Give --direction maximize or --direction minimize."
            )
        direction = direction_of(cfg.get("score_factor", 1))
    if metric.split("/")[0] == "valid" and not (
        cfg.get("valid_ds_name", None) and (cfg.get("every_val", 1) or 0) >= 1
    ):
        raise ConfigError(
            f"the sweep optimises {metric}, but the config never evaluates the valid split "
            f"(valid_ds_name unset or every_val = 0): no trial would have a score."
        )
    return metric, direction


def _default_study(sweep_dir) -> str:
    return Path(sweep_dir).absolute().name or "sweep"


def check_directory(sweep_dir, record: SweepRecord) -> None:
    """Refuse a directory that holds another sweep, or trials of no sweep at all."""
    sweep_dir = Path(sweep_dir)
    found = SweepRecord.read(sweep_dir)
    if found is not None:
        refuse_if_different(sweep_dir, found, record)
        return
    if sweep_dir.is_dir():
        strays = sorted(p.name for p in sweep_dir.iterdir() if p.name.startswith(TRIAL_PREFIX))
        if strays or (sweep_dir / JOURNAL_FILE).exists():
            shown = ", ".join(strays[:3]) or JOURNAL_FILE
            raise ConfigError(
                f"{sweep_dir} holds {shown} but no {RECORD_FILE}: it is not a sweep this "
                f"version can continue.\n  Give the sweep a new --dir."
            )


def refuse_if_different(sweep_dir, found: SweepRecord, asked: SweepRecord) -> None:
    changes = found.differences(asked)
    if not changes:
        return
    listed = "\n".join(f"    {name}: {old!r} -> {new!r}" for name, old, new in changes)
    raise ConfigError(
        f"{Path(sweep_dir) / RECORD_FILE} records another sweep than this command asks for:\n"
        f"{listed}\n"
        f"  Run the command that started it to continue it, or give this sweep a new --dir."
    )
