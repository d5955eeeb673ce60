"""Config checks that run before anything is built: required fields, values, dotted paths."""

import numbers
import warnings
from collections.abc import Iterable

from ml_collections import config_dict

from gatle_ignite import dispatch
from gatle_ignite.callbacks.logging import BUILTIN_BACKENDS, NOT_A_BACKEND
from gatle_ignite.config.base import REQUIRED_FIELDS
from gatle_ignite.config.names import HINT_CUTOFF, closest, misspelt_fields
from gatle_ignite.config.values import check_values
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.enhancements.compile import check_compile_value
from gatle_ignite.specs import EVAL_SPECS, EngineSpec
from gatle_ignite.trainer.telemetry.profiler import profile_schedule

__all__ = ["check_dispatch", "validate_config"]

_METRIC_FIELDS = ("train_metrics", "val_metrics", "tester_metrics")
_DS_PARAMS_FIELDS = ("train_ds_params", "valid_ds_params", "test_ds_params")


def _check_field_names(cfg, specs: tuple[EngineSpec, ...]) -> None:
    misspelt = misspelt_fields(cfg, specs)
    if not misspelt:
        return
    listed = "\n".join(f"  - {name!r}: did you mean {field!r}?" for name, field in misspelt)
    raise ConfigError(
        f"{len(misspelt)} config field(s) look like misspelt framework fields, which the "
        f"framework would never read:\n{listed}\n"
        f"  Correct the name in get_config(). A field of your own must not resemble a framework "
        f"field: rename it (a prefix of your project's, for example)."
    )


def _check_required(cfg) -> None:
    missing = [field for field in REQUIRED_FIELDS if cfg.get(field, None) in (None, "")]
    if missing:
        raise ConfigError(
            f"config is missing required field(s): {', '.join(map(repr, missing))}.\n"
            f"  Start from gatle_ignite.base_config() and set them in get_config()."
        )


def _check_n_saved(cfg) -> None:
    if not cfg.get("save_ckpt", True):
        return
    value = cfg.get("n_saved", 1)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"n_saved must be an int >= 1 (or None to keep every file), got {value!r}.\n"
            f"  To write no checkpoints at all, set save_ckpt = False."
        )


SCORE_MODES = {"max": 1, "min": -1}


def _apply_score_mode(cfg, spec: EngineSpec) -> None:
    """Turn ``score_mode`` into the factor the checkpoints, early stopping and sweeps read:
    ``min`` makes the default factor 1 into -1; a factor of the other sign is refused."""
    mode_field, factor_field = spec.score_mode_field, spec.score_factor_field
    mode = cfg.get(mode_field, None) if mode_field else None
    if mode is None:
        return
    if mode not in SCORE_MODES:
        raise ConfigError(
            f"{mode_field} = {mode!r}: it must be 'max' (higher is better) or 'min' (lower is "
            f"better)."
        )
    factor = cfg.get(factor_field, 1)
    if mode == "min" and factor == 1:
        cfg[factor_field] = -1
        return
    if not isinstance(factor, numbers.Real) or factor * SCORE_MODES[mode] <= 0:
        sign = "positive" if mode == "max" else "negative"
        raise ConfigError(
            f"{mode_field} = {mode!r} contradicts {factor_field} = {factor!r}: the best "
            f"checkpoint keeps the highest score times the factor, so {mode!r} needs a {sign} "
            f"factor.\n"
            f"  Leave {factor_field} at 1 and let {mode_field} say the direction."
        )


def _warn_about_scoring(cfg, spec: EngineSpec) -> None:
    if spec.score_field is None:
        return
    score_name = cfg.get(spec.score_field, None)
    if not score_name:
        return
    factor = cfg.get(spec.score_factor_field, 1) if spec.score_factor_field else 1
    if factor not in (1, -1):
        warnings.warn(
            f"{spec.score_factor_field} = {factor!r}: checkpointing keeps the MAXIMUM of "
            f"factor x {score_name!r}, so use 1 (higher is better) or -1 (lower is better).",
            stacklevel=3,
        )
    never_built = (
        f"so no '{spec.key}' engine is built and no best-on-{spec.engine_type} checkpoint will "
        f'ever be written, only "latest" ones.'
    )
    if spec.every_field is not None and cfg.get(spec.every_field, None) == 0:
        warnings.warn(
            f"{spec.score_field} = {score_name!r}, but {spec.every_field} = 0, {never_built}",
            stacklevel=3,
        )
    ds_field = f"{spec.split}_ds_name"
    if not cfg.get(ds_field, None):
        warnings.warn(
            f"{spec.score_field} = {score_name!r}, but {ds_field} is not set, {never_built}",
            stacklevel=3,
        )


def validate_config(
    cfg: config_dict.ConfigDict, specs: Iterable[EngineSpec] = EVAL_SPECS
) -> config_dict.ConfigDict:
    """Refuse misspelt and missing fields and bad values; warn about scores never kept."""
    specs = tuple(specs)
    _check_field_names(cfg, specs)
    _check_required(cfg)
    _check_n_saved(cfg)
    check_compile_value(cfg)
    profile_schedule(cfg.get("profile", False))
    check_values(cfg)
    for spec in specs:
        _apply_score_mode(cfg, spec)
        _warn_about_scoring(cfg, spec)
    return cfg


def _entries_with_cls_name(group):
    """``(key, cls_name)`` for the mapping-like entries of ``group`` that name a class."""
    if not hasattr(group, "items"):
        return []
    return [
        (key, entry.get("cls_name"))
        for key, entry in group.items()
        if hasattr(entry, "get") and entry.get("cls_name", None) is not None
    ]


def _dotted_paths(cfg):
    """Every ``(path, entrypoint, field label)`` the config names that check_dispatch covers."""
    # Read at call time, so rows added to the table at run time are checked too.
    for _label, entrypoint, _contract, fields in dispatch.CONTRACTS:
        for field in fields:
            path = cfg.get(field, None)
            if path:
                yield path, entrypoint, field

    criterion_params = cfg.get("criterion_params", None)
    if hasattr(criterion_params, "get"):
        losses = criterion_params.get("dict_of_loss_params", None)
        for key, path in _entries_with_cls_name(losses):
            yield path, "Loss", f"dict_of_loss_params.{key}.cls_name"

    for field in _METRIC_FIELDS:
        for key, path in _entries_with_cls_name(cfg.get(field, None)):
            yield path, "get_metric", f"{field}.{key}.cls_name"

    for field in _DS_PARAMS_FIELDS:
        ds_params = cfg.get(field, None)
        if hasattr(ds_params, "get"):
            sampler = ds_params.get("sampler_params", None)
            if hasattr(sampler, "get") and sampler.get("cls_name", None) is not None:
                yield sampler.get("cls_name"), "get_sampler", f"{field}.sampler_params.cls_name"

    for entry in cfg.get("logger_name", None) or ():
        if entry not in NOT_A_BACKEND and entry not in BUILTIN_BACKENDS:
            yield entry, "Backend", "logger_name"


def _backend_hint(error: str, entry: str) -> str:
    """A ``logger_name`` entry that does not import, told the built-in name it resembles."""
    builtin = (*BUILTIN_BACKENDS, *NOT_A_BACKEND)
    meant = closest(entry, builtin, HINT_CUTOFF) if "." not in entry else None
    if meant is None:
        return error
    return (
        f"{error.splitlines()[0]}\n  Did you mean the built-in {meant!r}? The built-in names: "
        f"{', '.join(map(repr, builtin))}; any other entry is a module exposing Backend."
    )


def check_dispatch(cfg: config_dict.ConfigDict) -> config_dict.ConfigDict:
    """Import every dotted path the config names; report all failures in one ConfigError."""
    errors: list[str] = []
    for path, entrypoint, field in _dotted_paths(cfg):
        try:
            dispatch.import_entrypoint(path, entrypoint, field=field)
        except ConfigError as error:
            errors.append(
                _backend_hint(str(error), path) if entrypoint == "Backend" else str(error)
            )
    if errors:
        listed = "\n\n".join(f"  - {error}" for error in errors)
        raise ConfigError(
            f"{len(errors)} dotted path(s) in this config do not resolve:\n\n{listed}"
        )
    return cfg
