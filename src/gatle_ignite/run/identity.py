"""What a run IS: the config fields that define it, their fingerprint, and what a resume changed.

Every field defines the run (the model, the optimizer and its hyperparameters, the loss, the
data, the batch size, the seed, AMP, accumulation, the schedule, and any field a project adds)
except the operational ones below, which say how the run is carried out, observed or stored.
"""

import fnmatch
import hashlib
import json
from collections.abc import Mapping

__all__ = [
    "BOOKKEEPING",
    "OPERATIONAL",
    "accepted",
    "bookkeeping",
    "config_changes",
    "fingerprint",
    "flatten",
    "operational",
]

# Dotted names, with shell-style wildcards, that name, store, log or place a run and never change
# what it trains: two runs differing only in these trained the same thing.
BOOKKEEPING = (
    "name",
    "project_name",
    "save_dir",
    "resume",
    "replace_run",
    "accept_changes",
    "run",
    "load_from_ckpt",
    "save_ckpt",
    "n_saved",
    "save_every_iters",
    "async_save",
    "logger_name",
    "verbosity",
    "progress_seconds",
    "log_every",
    "watch_grad",
    "tags",
    "export_params",
    "export_params.*",
    "wandb_entity",
    "discord_*",
    "master_addr",
    "master_port",
    "dist_timeout",
)
# The names a resume may change without changing what the run is: the bookkeeping, and the
# settings of how (not what) it trains. max_epochs is here because raising it continues the run;
# lowering it is refused elsewhere.
OPERATIONAL = (
    *BOOKKEEPING,
    "max_epochs",
    "model_checkpoint_dir",
    "strict",
    "check_every",
    "count_flops",
    "profile",
    "profile.*",
    "every_*",
    "*early_stop_patience",
    "*early_stop_after",
    # Words for the factor's sign, which the factor (a defining field) already records.
    "*score_mode",
    "activation_checkpointing",
    "fsdp_params.wrap",
    "fsdp_params.reshard_after_forward",
    "fsdp_params.cpu_offload",
    "compile",
    "compile_params",
    "compile_params.*",
    "cudnn_benchmark",
    "dist_backend",
    "nnodes",
    "node_rank",
    "nproc_per_node",
    "auto_model_params",
    "auto_model_params.*",
    "*_ds_params.num_workers",
    "*_ds_params.pin_memory",
    "*_ds_params.persistent_workers",
    "*_ds_params.prefetch_factor",
)


def flatten(payload: Mapping, prefix: str = "") -> dict:
    """``{"a.b": leaf}`` for every leaf of a JSON payload; an empty mapping is a leaf."""
    flat = {}
    for key, value in payload.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def bookkeeping(name: str) -> bool:
    """Whether ``name`` only names, stores, logs or places the run (BOOKKEEPING)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in BOOKKEEPING)


def operational(name: str) -> bool:
    """Whether a change of ``name`` leaves the run what it is."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in OPERATIONAL)


def _defining(payload: Mapping) -> dict:
    return {k: v for k, v in flatten(payload).items() if not operational(k)}


def fingerprint(payload: Mapping) -> str:
    """A short hash of the fields that define the run; equal configs give equal prints."""
    text = json.dumps(_defining(payload), sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


_ABSENT = object()


def config_changes(old: Mapping, new: Mapping, defaults: Mapping) -> list:
    """``[(field, old value, new value)]`` for every run-defining field that differs.

    A field one side lacks counts as unchanged when the other holds None or the framework's
    default, so that a framework version adding a field does not refuse older runs.
    """
    before, after, default = _defining(old), _defining(new), flatten(defaults)
    changes = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name, _ABSENT), after.get(name, _ABSENT)
        if a == b:
            continue
        present = b if a is _ABSENT else a
        if (a is _ABSENT or b is _ABSENT) and present in (None, default.get(name, _ABSENT)):
            continue
        changes.append((name, None if a is _ABSENT else a, None if b is _ABSENT else b))
    return changes


def accepted(name: str, accept: list) -> bool:
    """Whether ``accept`` names ``name`` or a group holding it (``model_params`` covers
    ``model_params.hidden``)."""
    return any(name == a or name.startswith(f"{a}.") for a in accept)
