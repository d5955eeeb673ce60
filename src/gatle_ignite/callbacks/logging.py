"""Logging: fan the engines' metrics out to the sinks named in ``cfg.logger_name``."""

import importlib
import importlib.util
import sys
import warnings
from types import ModuleType

import ignite.distributed as idist
import torch
from ignite.engine import Events

from gatle_ignite.callbacks.run_record import write_config_json
from gatle_ignite.dispatch import ConfigError, import_entrypoint
from gatle_ignite.utils.dist import rank_zero_print

__all__ = [
    "BUILTIN_BACKENDS",
    "NOT_A_BACKEND",
    "Backend",
    "LoggingCallback",
    "check_extra_installed",
    "import_extra",
]

# The 0.4 names first; each optional one is also the name of the extra that installs it.
BUILTIN_BACKENDS = ("text", "wandb", "discord", "tensorboard", "csv", "mlflow")
# Entries of logger_name that are trainer flags, not sinks.
NOT_A_BACKEND = ("pbar",)
# The package each optional built-in backend needs, which its extra installs.
_EXTRA_PACKAGES = {
    "wandb": "wandb",
    "discord": "requests",
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
}


class Backend:
    """A logging sink. Subclass it and override ``log``; ``watch`` and ``finish`` are no-ops."""

    def __init__(self, cfg):
        self.cfg = cfg

    def log(self, metrics, step=None, epoch=None):
        pass

    def watch(self, model):
        pass

    def finish(self, failed=False):
        pass


def _missing_extra(backend: str, reason: str) -> ConfigError:
    return ConfigError(
        f"logger_name names {backend!r}, but its package is not installed ({reason}).\n"
        f'  Install it with `pip install "gatle-ignite[{backend}]"`, or drop {backend!r} '
        "from logger_name."
    )


def import_extra(module: str, backend: str) -> ModuleType:
    """Import the package behind built-in ``backend``, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise _missing_extra(backend, str(err)) from err


def _installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_extra_installed(backend: str) -> None:
    """Refuse a built-in ``backend`` whose package is absent, without importing it."""
    package = _EXTRA_PACKAGES.get(backend)
    if package is not None and not _installed(package):
        raise _missing_extra(backend, f"no module named {package!r}")


def _scalar(value):
    if torch.is_tensor(value):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def _flatten(metrics) -> dict:
    """One level of ``{name: scalar}``: summaries dropped, dict values spread as ``key_sub``."""
    flat = {}
    for key, value in metrics.items():
        if "summary" in key:
            continue
        if isinstance(value, dict):
            for sub, inner in value.items():
                flat[f"{key}_{sub}"] = _scalar(inner)
        else:
            flat[key] = _scalar(value)
    return flat


def _backend_path(name) -> str:
    return f"gatle_ignite.callbacks.backends.{name}" if name in BUILTIN_BACKENDS else name


def _grad_norm(model) -> float:
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


class LoggingCallback:
    """Builds the named backends on rank 0 and wires them to the engines' events."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.backends = []

    def start(self):
        if idist.get_rank() != 0:
            return self
        if self.cfg.get("save_dir"):
            write_config_json(self.cfg)
        try:
            for name in self.cfg.logger_name:
                if name in NOT_A_BACKEND:
                    continue
                backend_cls = import_entrypoint(_backend_path(name), "Backend", field="logger_name")
                self.backends.append(backend_cls(self.cfg))
        except BaseException:
            # The sinks already built (an open W&B or MLflow run) must not outlive the error.
            self.finish(failed=True)
            raise
        return self

    def _log(self, metrics, step=None, epoch=None):
        for backend in self.backends:
            backend.log(metrics, step=step, epoch=epoch)

    def on_train_epoch_end(self, trainer, optimizer):
        if not self.backends:
            return  # other ranks, or no sink named: nothing to collect per iteration

        @trainer.on(Events.EPOCH_COMPLETED(every=1))
        def _log_train_metrics(engine):
            # A run stopped at this point (a non-finite loss) has nothing good to log.
            if not engine.should_terminate:
                self._log(_flatten(engine.state.metrics), epoch=engine.state.epoch)

        @trainer.on(Events.ITERATION_COMPLETED(every=self.cfg.log_every))
        def _log_lr(engine):
            if engine.should_terminate:
                return
            lrs = {f"train/lr_{i}": group["lr"] for i, group in enumerate(optimizer.param_groups)}
            self._log(lrs, step=engine.state.iteration, epoch=engine.state.epoch)

    def on_train_iteration(self, trainer, model):
        if not self.cfg.watch_grad or not self.backends:
            return
        for backend in self.backends:
            backend.watch(model)

        @trainer.on(Events.ITERATION_COMPLETED(every=self.cfg.log_every))
        def _log_grad_norm(engine):
            if engine.should_terminate:
                return
            self._log(
                {"train/grad_norm": _grad_norm(model)},
                step=engine.state.iteration,
                epoch=engine.state.epoch,
            )

    def on_valid_epoch_end(self, trainer, engine):
        if not self.backends:
            return

        @engine.on(Events.EPOCH_COMPLETED)
        def _log_eval_metrics(eval_engine):
            self._log(_flatten(eval_engine.state.metrics), epoch=trainer.state.epoch)

    def on_completion(self, trainer):
        @trainer.on(Events.COMPLETED)
        def _announce(engine):
            rank_zero_print(f"TRAINING COMPLETE after {engine.state.epoch} epochs")

    def finish(self, failed=False):
        """Finish every backend, even when one of them raises, then forget them all."""
        errors = []
        for backend in self.backends:
            try:
                backend.finish(failed=failed)
            except Exception as err:
                errors.append((type(backend).__module__, err))
        self.backends = []
        # After a crash the crash is what propagates; a clean run surfaces the first error.
        raised = errors[0][1] if errors and not failed else None
        for module, err in errors:
            if err is not raised:
                warnings.warn(
                    f"logging backend {module!r} did not finish cleanly: {err!r}", stacklevel=2
                )
        if raised is not None:
            raise raised
