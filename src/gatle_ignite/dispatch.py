"""Dotted-path dispatch: every component is a module path plus a fixed entrypoint name."""

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import sys
from pathlib import Path
from typing import Optional

__all__ = [
    "CONTRACTS",
    "ConfigError",
    "call_with_params",
    "import_entrypoint",
    "import_module_from_path",
    "report_config_error",
    "shadowing_hint",
]


class ConfigError(Exception):
    """A config names something that cannot be resolved, or a value is missing or invalid."""


def report_config_error(error: ConfigError) -> None:
    """Print ``config error: ...`` on stderr: the message and its fix, no traceback."""
    from gatle_ignite.redaction import redact_text  # ml_collections: not for `--version`
    from gatle_ignite.utils.escapes import escaped

    # The last line of defence: a message built anywhere may quote a URL with credentials, or
    # a name from a file someone else wrote with control characters in it.
    print(file=sys.stderr)
    print(
        f"config error: {escaped(redact_text(str(error)), lines=True)}", file=sys.stderr, flush=True
    )


# (label, entrypoint, contract, top-level fields check_dispatch resolves against the entrypoint)
CONTRACTS = (
    (
        "main_runner",
        "Trainer",
        "A BaseTrainer subclass, usually overriding only prep_batch. "
        "Constructed as Trainer(local_rank, cfg).",
        ("main_runner",),
    ),
    (
        "model_name + model_params",
        "Model",
        "Model(**model_params); its forward returns a dict. "
        "A plain function returning an nn.Module also works.",
        ("model_name",),
    ),
    (
        "train_ds_name / valid_ds_name / test_ds_name + *_ds_params",
        "get_ds",
        "get_ds(ds_params, transform) returns (dataloader, info); info['length'] is required, "
        "and the training split's optional info['tokens_per_sample'] gives perf/tokens_per_s.",
        ("train_ds_name", "valid_ds_name", "test_ds_name"),
    ),
    (
        "aug_name + aug_params",
        "Transformation",
        "Transformation(**aug_params), any callable; built once and passed to every split.",
        ("aug_name",),
    ),
    (
        "criterion_name + criterion_params",
        "Loss",
        "An nn.Module Loss(**criterion_params) whose forward(y_pred, target, iteration=None) "
        "returns (total, {'loss_<key>': tensor}) and which has a crit_keys attribute; or one "
        "loss term returning a bare tensor (a built-in such as gatle_ignite.losses.cross_entropy), "
        "logged as the total alone.",
        ("criterion_name",),
    ),
    (
        "optimizer_name + optimizer_params",
        "get_optimizer",
        "get_optimizer(model, **optimizer_params) returns the object held as trainer.optimizer.",
        ("optimizer_name",),
    ),
    (
        "lr_scheduler + lr_scheduler_params",
        "get_scheduler",
        "get_scheduler(cfg, train_dl, optimizer, engines, **params) returns "
        "(scheduler, engine_name, event).",
        ("lr_scheduler",),
    ),
    (
        "{train,val,tester}_metrics[<name>].cls_name + params",
        "get_metric",
        "get_metric(engine_type, info, **params) returns an ignite Metric.",
        (),
    ),
    (
        "*_ds_params.collate_fn.cls_name + params",
        "get_collate_fn",
        "get_collate_fn(**params) returns the collate callable.",
        (),
    ),
    (
        "*_ds_params.sampler_params.cls_name + params",
        "get_sampler",
        "get_sampler(dataset, **params) returns a torch Sampler.",
        (),
    ),
    (
        "logger_name[<entry>]",
        "Backend",
        "Backend(cfg) with log(metrics, step=None, epoch=None), watch(model) and "
        "finish(failed=False).",
        (),
    ),
)


def _origin(field):
    return f" (from config field '{field}')" if field else ""


def import_module_from_path(path, field=None):
    """Import the module a config names, turning every import failure into a ConfigError."""
    if not isinstance(path, str):
        raise ConfigError(f"expected a dotted module path string{_origin(field)}, got {path!r}")
    if not path:
        raise ConfigError(f"empty module path{_origin(field)}")
    if not all(part.isidentifier() for part in path.split(".")):
        # importlib would read '.x' as relative and '/' as a file system path.
        raise ConfigError(
            f"'{path}'{_origin(field)} is not a dotted module path.\n"
            f"  Write it as Python imports it, e.g. 'examples.synthetic.models.mlp'."
        )
    try:
        return importlib.import_module(path)
    except ImportError as error:
        shadowed = shadowing_hint(path)
        if shadowed:
            raise ConfigError(
                f"could not import '{path}'{_origin(field)}: {error}\n{shadowed}"
            ) from error
        raise ConfigError(
            f"could not import '{path}'{_origin(field)}: {error}{_underlying(error)}\n"
            f"  {_import_fix(path, error)}"
        ) from error


def _underlying(error: BaseException) -> str:
    """The first line of the error an import error was raised from, where it wraps one: a
    library importing lazily (``transformers``) reports only that its import failed."""
    inner, seen = error, {id(error)}
    while True:
        cause = inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
        if cause is None or id(cause) in seen:
            break
        inner = cause
        seen.add(id(inner))
    if inner is error:
        return ""
    first = next(iter(str(inner).splitlines()), "")
    return f"\n  Underlying error: {type(inner).__name__}: {first}"


def _import_fix(path: str, error: ImportError) -> str:
    """The likeliest fix for a path that does not import: the module when the path names
    something in it, a near name when a part of it is misspelt, else where to look."""
    parent, _, last = path.rpartition(".")
    holder = sys.modules.get(parent) if parent else None
    if holder is not None and hasattr(holder, last):
        return (
            f"'{last}' is a name inside the module '{parent}': a config names the module, and "
            f"the framework takes its entrypoint from it. Write '{parent}'."
        )
    # Only when the path itself is missing: a module of the project named like a built-in
    # (metrics/accuracy.py) that fails on an import of its own is no misnamed built-in.
    builtin = _builtin_named_like(path) if _names_missing(path, error) else []
    if builtin:
        return (
            f"gatle-ignite's own is {' or '.join(repr(b) for b in builtin)}: write its full path."
        )
    near = _near_path(path, error)
    if near:
        return f"Did you mean '{near}'?"
    return (
        "Check that it is importable from here (run from the project root, or fix "
        "PYTHONPATH / install the missing package)."
    )


def _builtin_modules() -> list:
    """The package's public modules, by full dotted name."""
    import gatle_ignite

    modules = pkgutil.walk_packages(gatle_ignite.__path__, "gatle_ignite.", onerror=lambda _: None)
    return [m.name for m in modules if not any(p.startswith("_") for p in m.name.split("."))]


def shadowing_hint(path: str) -> Optional[str]:
    """The fix when the first name of ``path`` is a folder here that an installed package of
    the same name shadows (PyPI has ``models``, ``metrics``, ``trainer``): a folder without
    ``__init__.py`` loses to any regular package of its name, wherever it is on sys.path."""
    top = path.split(".", 1)[0]
    folder = Path.cwd() / top
    if not folder.is_dir():
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if origin is None or Path(origin).resolve().is_relative_to(folder.resolve()):
        return None
    return (
        f"  '{top}' resolves to {origin}, an installed package, not this project's folder "
        f"{folder}: the installed one shadows it.\n"
        f"  Move the project's code under one package named after the project (with an "
        f"__init__.py, as `gatle-ignite init` writes it) and name that in the config, or "
        f"uninstall the other '{top}'."
    )


def _builtin_named_like(path: str) -> list:
    """The package's modules named as ``path`` ends, for a built-in written without its package
    (``adamw`` for ``gatle_ignite.optimizers.adamw``)."""
    last = path.rsplit(".", 1)[-1]
    return [name for name in _builtin_modules() if name.rsplit(".", 1)[-1] == last and name != path]


# How alike a misspelt part and a real module's name must be to be suggested: a module beside
# it, or a built-in ('cosin' for 'cosine', not 'nadam9' for 'adam').
_NEAR = 0.75
_NEAR_BUILTIN = 0.85
# Where the built-ins a config names live.
_COMPONENT_PACKAGES = (
    "gatle_ignite.optimizers.",
    "gatle_ignite.schedulers.",
    "gatle_ignite.losses.",
    "gatle_ignite.metrics.",
)


def _modules_in(folders: list) -> list:
    """The modules and packages in ``folders``, namespace packages (plain folders) included."""
    names = {module.name for module in pkgutil.iter_modules(folders)}
    for folder in folders:
        with contextlib.suppress(OSError, TypeError):
            names.update(
                entry.name
                for entry in os.scandir(folder or ".")
                if entry.is_dir() and entry.name.isidentifier()
            )
    return sorted(names)


def _names_missing(path: str, error: ImportError) -> bool:
    """Whether ``error`` is a part of ``path`` itself missing, not a package the module imports."""
    missing = getattr(error, "name", None)
    if not isinstance(error, ModuleNotFoundError) or not missing:
        return False
    return path == missing or path.startswith(f"{missing}.")


def _near_path(path: str, error: ImportError) -> Optional[str]:
    """``path`` with its first missing part replaced by the closest module beside it, or by the
    closest built-in; None when the failure is not that part missing (a package the module
    itself imports) or nothing is close."""
    if not _names_missing(path, error):
        return None
    missing = error.name
    parent, _, last = missing.rpartition(".")
    rest = path[len(missing) :]
    package = sys.modules.get(parent) if parent else None
    if parent and not hasattr(package, "__path__"):
        return None
    siblings = _modules_in(list(package.__path__) if parent else sys.path)
    match = _nearest_name(last, siblings, _NEAR)
    if match:
        return f"{parent}.{match}{rest}" if parent else f"{match}{rest}"
    by_last = {
        name.rsplit(".", 1)[-1]: name
        for name in _builtin_modules()
        if name.startswith(_COMPONENT_PACKAGES)
    }
    match = _nearest_name(path.rsplit(".", 1)[-1], sorted(by_last), _NEAR_BUILTIN)
    return by_last[match] if match else None


def _nearest_name(word: str, names: list, cutoff: float) -> Optional[str]:
    """The name one slip away from ``word`` (a letter wrong, missing, extra, or two swapped),
    the one of ``word``'s length first ('adamw' for 'adamv', 'mlp' for 'mpl'); else the most
    alike at ``cutoff``."""
    slips = [name for name in names if _one_slip(word, name)]
    if slips:
        return min(slips, key=lambda name: (len(name) != len(word), name))
    match = difflib.get_close_matches(word, names, n=1, cutoff=cutoff)
    return match[0] if match else None


def _one_slip(word: str, name: str) -> bool:
    if word == name or abs(len(word) - len(name)) > 1 or min(len(word), len(name)) < 3:
        return False
    if len(word) == len(name):
        wrong = [i for i, (a, b) in enumerate(zip(word, name)) if a != b]
        if len(wrong) != 2:
            return len(wrong) == 1
        i, j = wrong
        return j == i + 1 and (word[i], word[j]) == (name[j], name[i])
    short, long = sorted((word, name), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def import_entrypoint(path, attr, field=None):
    """Return ``attr`` of the module at ``path``; a missing attribute lists what it does have."""
    module = import_module_from_path(path, field=field)
    if not hasattr(module, attr):
        named = f" (named by config field '{field}')" if field else ""
        public = sorted(name for name in vars(module) if not name.startswith("_"))
        raise ConfigError(
            f"module '{path}'{named} must expose '{attr}', but does not.\n  Found: {public}"
        )
    return getattr(module, attr)


class ParamsError(ConfigError, TypeError):
    """Config params an entrypoint's signature refuses. Also a TypeError, as the call's was."""


_SIGNATURE_MISMATCH = (
    "unexpected keyword argument",
    "required positional argument",
    "multiple values",
)


def call_with_params(entrypoint, params, field, *args):
    """``entrypoint(*args, **params)``, blaming ``field`` when it refuses the params.

    A refused signature is always the config's fault. So is a TypeError or ValueError from a
    built-in (``gatle_ignite.*``), which only passes the params on; one raised inside a
    project's own code keeps its traceback.
    """
    params = dict(params or {})
    module = getattr(entrypoint, "__module__", None) or "?"
    name = f"{module}.{getattr(entrypoint, '__qualname__', entrypoint)}"
    try:
        return entrypoint(*args, **params)
    except (TypeError, ValueError) as error:
        mismatch = isinstance(error, TypeError) and any(
            fragment in str(error) for fragment in _SIGNATURE_MISMATCH
        )
        if not mismatch and not module.startswith("gatle_ignite."):
            _note_library(error, field, params, f"while building {name}(**{field}) from")
            raise
        key = None if mismatch else _blamed_key(params, str(error))
        if key is not None:
            raise ParamsError(
                f"{field}.{key}: {error}\n  {name} refuses it; fix cfg.{field}.{key}."
            ) from error
        raise ParamsError(
            f"{field} not accepted by {name}: {error}\n"
            f"  Its parameters: {_signature_of(entrypoint)}; fix cfg.{field}."
        ) from error
    except Exception as error:
        _note_library(error, field, params, f"while building {name}(**{field}) from")
        raise


def _note_library(error: Exception, field: str, params: dict, built: str) -> None:
    """Name the config field on an error raised inside a library the entrypoint called."""
    from gatle_ignite.utils.frames import add_note, library_note

    note = library_note(error, field, params, built)
    if note is not None:
        add_note(error, note)


def _blamed_key(params: dict, message: str) -> Optional[str]:
    """The one key whose value the message quotes (torch's ``Invalid learning rate: -0.001``
    names lr), or None when no key's value, or more than one's, appears in it."""

    def quoted(value) -> bool:
        if isinstance(value, (list, tuple)):
            return any(quoted(item) for item in value)
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or value == "":
            return False
        return re.search(rf"(?<![\w.]){re.escape(str(value))}(?![\w.])", message) is not None

    keys = [key for key, value in params.items() if quoted(value)]
    return keys[0] if len(keys) == 1 else None


def _signature_of(entrypoint) -> str:
    try:
        return str(inspect.signature(entrypoint))
    except (TypeError, ValueError):
        return "(unknown)"
