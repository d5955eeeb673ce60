"""Value checks for the framework's own fields, so a bad value is a ConfigError, not a crash.

Each rule names the fields it covers and what they must hold; ``check_values`` applies them all
and reports every bad field in one error. Fields a project adds are never checked.
"""

import numbers
from collections.abc import Mapping

from gatle_ignite.callbacks.run_record import shown_value
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.utils.amp import AMP_DTYPES

__all__ = ["check_values"]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_mapping(value) -> bool:
    return isinstance(value, Mapping) or hasattr(value, "items")


def _export_params_ok(value) -> bool:
    """None, or a mapping holding at most ``dynamic``: input keys to lists of dimensions."""
    if value is None:
        return True
    if not _is_mapping(value) or set(value) - {"dynamic"}:
        return False
    dynamic = value.get("dynamic") or {}
    return _is_mapping(dynamic) and all(
        isinstance(key, str) and isinstance(dims, (list, tuple)) and all(map(_is_int, dims))
        for key, dims in dynamic.items()
    )


# (fields, accepts(value), what the value must be). None passes only where a rule says so.
_RULES = (
    (("max_epochs",), lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    # The trainer's own words for it, which it says again when a script builds one.
    (("accum_steps",), lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    (("amp_dtype",), lambda v: v in AMP_DTYPES, f"one of {', '.join(map(repr, AMP_DTYPES))}"),
    (
        ("every_val", "every_test", "early_stop_patience", "early_stop_after", "save_every_iters"),
        lambda v: _is_int(v) and v >= 0,
        "an int >= 0 (0 turns it off)",
    ),
    (
        ("train_length", "val_length", "test_length", "check_every"),
        lambda v: v is None or (_is_int(v) and v >= 1),
        "None (the whole loader) or an int >= 1",
    ),
    (
        ("log_every",),
        lambda v: v is None or (_is_int(v) and v >= 1),
        "None (a default tied to the epoch's length) or an int >= 1",
    ),
    (
        ("grad_clip_norm", "grad_clip_value"),
        lambda v: v is None or (_is_number(v) and v > 0),
        "None (off) or a number > 0",
    ),
    (
        ("score_factor", "tester_score_factor"),
        _is_number,
        "a number (1, or -1 for lower-is-better)",
    ),
    (("dist_timeout",), lambda v: v is None or (_is_int(v) and v >= 1), "None or an int >= 1"),
    (("verbosity",), lambda v: _is_int(v) and 0 <= v <= 2, "0, 1 or 2"),
    (
        ("progress_seconds",),
        lambda v: _is_number(v) and v >= 0,
        "a number of seconds >= 0 (0: every progress line, as on a terminal)",
    ),
    (("strategy",), lambda v: v in ("ddp", "fsdp"), "'ddp' or 'fsdp'"),
    # NumPy's seeding range, which setup_seed passes every seed through.
    (("seed",), lambda v: _is_int(v) and 0 <= v < 2**32, "an int in [0, 2**32)"),
    (
        (
            "save_ckpt",
            "resume",
            "replace_run",
            "strict",
            "watch_grad",
            "cudnn_benchmark",
            "async_save",
            "count_flops",
        ),
        lambda v: isinstance(v, bool),
        "True or False",
    ),
    (
        ("logger_name", "tags", "accept_changes", "activation_checkpointing"),
        lambda v: isinstance(v, (list, tuple)) and all(isinstance(e, str) and e for e in v),
        "a list of non-empty strings",
    ),
    (
        (
            "model_params",
            "auto_model_params",
            "train_ds_params",
            "valid_ds_params",
            "test_ds_params",
            "aug_params",
            "criterion_params",
            "optimizer_params",
            "lr_scheduler_params",
            "compile_params",
            "fsdp_params",
        ),
        lambda v: v is None or _is_mapping(v),
        "a mapping of keyword arguments",
    ),
    (
        ("train_metrics", "val_metrics", "tester_metrics"),
        lambda v: not v or _is_mapping(v),
        "a mapping of name -> {'cls_name', 'params'}",
    ),
    (
        ("name", "save_dir", "project_name", "model_checkpoint_dir", "dist_backend"),
        lambda v: v is None or isinstance(v, str),
        "a string",
    ),
    (
        ("lr_scheduler",),
        lambda v: v is None or (isinstance(v, str) and v != ""),
        "None (no schedule) or a dotted module path",
    ),
    (
        ("score_name", "tester_score_name", "load_from_ckpt"),
        lambda v: v is None or isinstance(v, str),
        "a string naming a metric such as 'valid/acc'",
    ),
    (
        ("export_params",),
        _export_params_ok,
        "a mapping such as {'dynamic': {'input_ids': [0, 1]}} (model_input keys to dimensions)",
    ),
)

# The loader keys build_dataloader reads in every *_ds_params.
_LOADER_RULES = (
    (("bs",), lambda v: _is_int(v) and v >= 1, "an int >= 1 (the total batch across ranks)"),
    (("num_workers",), lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    (
        ("shuffle", "drop_last", "pin_memory", "exact_sharding"),
        lambda v: isinstance(v, bool),
        "True or False",
    ),
)


def _problems(container, rules, prefix=""):
    for fields, accepts, expected in rules:
        for field in fields:
            if field not in container:
                continue
            value = container[field]
            try:
                ok = accepts(value)
            except TypeError:
                ok = False
            if not ok:
                path = f"{prefix}{field}"
                yield f"{path} must be {expected}, got {shown_value(path, value)}"


def check_values(cfg) -> None:
    """Refuse every framework field whose value the run could not use, all in one message."""
    problems = list(_problems(cfg, _RULES))
    for field in ("train_ds_params", "valid_ds_params", "test_ds_params"):
        params = cfg.get(field, None)
        if _is_mapping(params):
            problems += _problems(params, _LOADER_RULES, prefix=f"{field}.")
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        raise ConfigError(
            f"{len(problems)} config value(s) cannot be used:\n{listed}\n"
            f"  Fix them in get_config() or in the --override that set them."
        )
