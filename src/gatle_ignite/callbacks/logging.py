"""Logging: fan the engines' metrics out to the sinks named in ``cfg.logger_name``."""

import collections
import importlib
import importlib.util
import math
import sys
import time
import warnings
from types import ModuleType
from typing import Optional

import ignite.distributed as idist
import torch
from ignite.engine import Events

from gatle_ignite.callbacks.run_record import write_config_json
from gatle_ignite.dispatch import ConfigError, import_entrypoint
from gatle_ignite.run.filesystem import holds_files
from gatle_ignite.run.storage import is_url
from gatle_ignite.utils.dist import rank_zero_print
from gatle_ignite.utils.train_command import under_train_command

__all__ = [
    "BUILTIN_BACKENDS",
    "NOT_A_BACKEND",
    "Backend",
    "LoggingCallback",
    "check_extra_installed",
    "import_extra",
    "log_cadence",
    "tell",
]

# The 0.4 names first; each optional one is also the name of the extra that installs it.
BUILTIN_BACKENDS = ("text", "wandb", "discord", "tensorboard", "csv", "mlflow")
# Entries of logger_name that are trainer flags, not sinks.
NOT_A_BACKEND = ("pbar",)
# The built-in sinks that write into save_dir.
_FILE_SINKS = ("csv", "tensorboard")
# The package each optional built-in backend needs, which its extra installs.
_EXTRA_PACKAGES = {
    "wandb": "wandb",
    "discord": "requests",
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
}


class Backend:
    """A logging sink. Subclass it and override ``log``; ``watch`` and ``finish`` are no-ops.

    ``log`` gets one record per epoch (every engine's metrics of that epoch together) and, when
    ``per_iteration`` is true, the points logged every ``log_cadence`` iterations (the learning
    rates, the loss, the gradient norm). Every record carries the trainer's global iteration as
    ``step`` and the epoch alongside, so all curves share one axis.
    """

    per_iteration = True

    def __init__(self, cfg):
        self.cfg = cfg

    def log(self, metrics, step=None, epoch=None):
        pass

    def log_many(self, records):
        """``log`` each ``(metrics, step, epoch)`` of ``records``, in order: the per-iteration
        points the run writes together. A sink that can write them in one go overrides it."""
        for metrics, step, epoch in records:
            self.log(metrics, step=step, epoch=epoch)

    def watch(self, model):
        pass

    def name_lr_groups(self, names):
        """The optimizer's param groups are named ``names``, in order: ``train/lr_<i>`` is the
        learning rate of ``names[i]``. Called once, before anything is logged."""

    def graph(self, model, inputs):
        """Draw the model's graph: ``model(*inputs)`` runs the task's forward on the first
        training batch (``inputs``, a tuple of tensors, is its ``model_input`` as
        ``prep_batch`` made it). Called once, at a fresh run's first iteration, only for a
        sink whose class overrides it; a failure here must not stop training."""

    def rewind(self, step):
        """The run resumed at ``step``: what was logged after it is trained and logged again,
        so a sink that keeps a history drops it rather than holding it twice."""

    def finish(self, failed=False):
        pass


# log_every when the config leaves it unset: 100, or less in a short epoch, so that a run of a
# few hundred iterations still draws its learning-rate schedule.
_DEFAULT_LOG_EVERY = 100
_POINTS_PER_EPOCH = 20
# The longest a point whose loss is read waits to be written. Points written together cost
# a fraction of one write per iteration (bench/README.md), and a live plot stays current.
POINTS_WRITTEN_EVERY_S = 1.0


def log_cadence(cfg, epoch_length: Optional[int]) -> int:
    """Iterations between per-iteration points: ``cfg.log_every``, or, unset, every
    ``epoch_length // 20`` iterations (at least 1, at most 100)."""
    every = cfg.get("log_every", None)
    if every is not None:
        return every
    if not epoch_length:
        return _DEFAULT_LOG_EVERY
    return min(_DEFAULT_LOG_EVERY, max(epoch_length // _POINTS_PER_EPOCH, 1))


def tell(logger, method: str, *args, **kwargs) -> None:
    """Call ``logger.<method>`` if it has one: a task's own logger object (or a test's spy) may
    have only some of 0.4's protocol, and none of the newer methods."""
    call = getattr(logger, method, None)
    if call is not None:
        call(*args, **kwargs)


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


def _build(name, cfg):
    return import_entrypoint(_backend_path(name), "Backend", field="logger_name")(cfg)


def _grad_norm(model) -> float:
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


class LoggingCallback:
    """Builds the named backends on rank 0 and wires them to the engines' events.

    Besides the named backends, every run keeps its metric history in ``<save_dir>/metrics.csv``
    (the csv backend, unless named already), and with ``pbar`` the epoch blocks of ``text``
    are printed too.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.backends = []
        # The sinks the framework adds itself, after the named ones.
        self._implicit = []
        # One epoch's metrics of every engine, logged together once the epoch is over.
        self._epoch_record = {}
        # The non-finite check, whose reads give the points their train/loss.
        self._losses = None
        # (iteration, epoch, point) logged but not yet written: their loss is not read yet, or
        # they wait to be written together (POINTS_WRITTEN_EVERY_S).
        self._points = collections.deque()
        self._points_written = time.monotonic()
        # Iterations between per-iteration points (log_cadence), once the trainer runs.
        self._log_every = None
        self.started = False

    @property
    def sinks(self) -> list:
        return [*self.backends, *self._implicit]

    def start(self, keep_files: bool = True):
        """Build the sinks; ``keep_files=False`` leaves out those writing into save_dir (and
        config.json), for a run that must write nothing there."""
        self.started = True
        if idist.get_rank() != 0:
            return self
        if self.cfg.get("save_dir") and keep_files:
            write_config_json(self.cfg)
        skipped = () if keep_files else _FILE_SINKS
        try:
            for name in self.cfg.logger_name:
                if name not in NOT_A_BACKEND and name not in skipped:
                    self.backends.append(_build(name, self.cfg))
            for name in self._implied(keep_files):
                self._implicit.append(_build(name, self.cfg))
        except BaseException:
            # The sinks already built (an open W&B or MLflow run) must not outlive the error.
            self.finish(failed=True)
            raise
        return self

    def start_in(self, run_dir) -> None:
        """Start the sinks for the run ``run_dir`` holds (None: fit() has opened no run yet).

        A save_dir holding files is fit()'s to resume, replace or refuse, so until fit() has
        opened its run the sinks, which would write there, wait; a second call starts them.
        """
        if self.started:
            return
        opened = run_dir is not None and run_dir.is_open
        save_dir = self.cfg.get("save_dir")
        # A URL counts as holding a run: what it holds is known once fit() has opened it.
        if opened or not (is_url(save_dir) or holds_files(save_dir)):
            self.start(keep_files=run_dir is None or run_dir.keeps_files)

    def _implied(self, keep_files: bool) -> list:
        named = set(self.cfg.logger_name)
        kept = keep_files and self.cfg.get("save_dir")
        implied = ["csv"] if "csv" not in named and kept else []
        if "pbar" in named and "text" not in named:
            implied.append("text")
        return implied

    def _log(self, metrics, step=None, epoch=None, per_iteration=False):
        self._log_records([(metrics, step, epoch)], per_iteration)

    def _log_records(self, records, per_iteration=False):
        """Send ``(metrics, step, epoch)`` records, in order, to every sink in one call each."""
        for sink in self.sinks:
            if per_iteration and not getattr(sink, "per_iteration", True):
                continue
            many = getattr(sink, "log_many", None)
            if many is not None:
                many(records)
                continue
            # A sink of 0.4's protocol, which need not subclass Backend.
            for metrics, step, epoch in records:
                sink.log(metrics, step=step, epoch=epoch)

    def log(self, metrics, step=None, epoch=None) -> None:
        """Send one record of ``{name: scalar}`` to every sink (the epochs' ``perf/`` records)."""
        self._log(metrics, step=step, epoch=epoch)

    def rewind(self, step) -> None:
        for sink in self.sinks:
            sink.rewind(step)

    def name_lr_groups(self, names) -> None:
        """Tell every sink the names of the optimizer's param groups (none: unnamed)."""
        for sink in self.sinks if names else ():
            # A sink of 0.4's protocol, not subclassing Backend, may lack it.
            method = getattr(sink, "name_lr_groups", None)
            if method is not None:
                method(names)

    def _drawing(self) -> list:
        return [
            s for s in self.sinks if getattr(type(s), "graph", Backend.graph) is not Backend.graph
        ]

    def wants_graph(self) -> bool:
        """Whether a sink draws the model's graph, so the first batch is worth tracing."""
        return bool(self._drawing())

    def graph(self, model, inputs) -> None:
        for sink in self._drawing():
            sink.graph(model, inputs)

    def follow_losses(self, check) -> None:
        """Log each per-iteration point's loss, as ``check`` reads it, as ``train/loss``.

        A point waits for the check that reads its loss, so logging makes no read of its own;
        a point at or after a non-finite loss is dropped.
        """
        self._losses = check
        check.on_read(self._losses_read)

    def _losses_read(self, pairs) -> None:
        if self._points and pairs:
            losses = dict(pairs)
            for iteration, _epoch, point in self._points:
                if iteration in losses:
                    point["train/loss"] = losses[iteration]
        self._write_points()

    def _write_points(self, now: bool = False) -> None:
        """Write the points whose loss is read, at most POINTS_WRITTEN_EVERY_S after the last
        write, or ``now`` (an epoch's end, the run's)."""
        if not now and time.monotonic() - self._points_written < POINTS_WRITTEN_EVERY_S:
            return
        self._points_written = time.monotonic()
        check = self._losses
        through = check.checked_through if check is not None else math.inf
        bad = check.first_bad if check is not None else None
        records = []
        while self._points and self._points[0][0] <= through:
            iteration, epoch, point = self._points.popleft()
            if bad is None or iteration < bad:
                records.append((point, iteration, epoch))
        if records:
            self._log_records(records, per_iteration=True)

    def on_train_epoch_end(self, trainer, optimizer):
        if not self.sinks:
            return  # other ranks: nothing to collect per iteration

        @trainer.on(Events.EPOCH_COMPLETED)
        def _record_train_metrics(engine):
            # A run stopped at this point (a non-finite loss) has nothing good to log.
            if not engine.should_terminate:
                self._epoch_record.update(_flatten(engine.state.metrics))

        @trainer.on(Events.ITERATION_COMPLETED)
        def _log_lr_and_loss(engine):
            if not self._log_point_due(engine) or engine.should_terminate:
                return
            point = {f"train/lr_{i}": group["lr"] for i, group in enumerate(optimizer.param_groups)}
            iteration = engine.state.iteration
            last = self._losses.last_loss if self._losses is not None else None
            if last is not None and last[0] == iteration:
                point["train/loss"] = last[1]
            self._points.append((iteration, engine.state.epoch, point))
            self._write_points()

    def _log_point_due(self, engine) -> bool:
        """Whether this iteration logs a point. Tested in the handler, not by an event filter,
        which ignite calls through a wrapper on every iteration."""
        every = self._log_every
        if every is None:
            # Worked out once: the epoch's length is known once the engine runs.
            every = self._log_every = log_cadence(self.cfg, engine.state.epoch_length)
        return engine.state.iteration % every == 0

    def on_train_iteration(self, trainer, model):
        if not self.cfg.watch_grad or not self.backends:
            return
        for backend in self.backends:
            backend.watch(model)

        @trainer.on(Events.ITERATION_COMPLETED)
        def _log_grad_norm(engine):
            if not self._log_point_due(engine) or engine.should_terminate:
                return
            self._log(
                {"train/grad_norm": _grad_norm(model)},
                step=engine.state.iteration,
                epoch=engine.state.epoch,
                per_iteration=True,
            )

    def on_valid_epoch_end(self, trainer, engine):
        if not self.sinks:
            return

        @engine.on(Events.EPOCH_COMPLETED)
        def _record_eval_metrics(eval_engine):
            self._epoch_record.update(_flatten(eval_engine.state.metrics))

    def on_epoch_logged(self, trainer):
        """After the epoch's evaluations: one record of every engine's metrics."""
        if not self.sinks:
            return

        @trainer.on(Events.EPOCH_COMPLETED)
        def _log_epoch(engine):
            # The epoch's points first, as they happened.
            self._write_points(now=True)
            record, self._epoch_record = self._epoch_record, {}
            if record:
                self._log(record, step=engine.state.iteration, epoch=engine.state.epoch)

    def on_completion(self, trainer):
        @trainer.on(Events.COMPLETED)
        def _announce(engine):
            if under_train_command():
                return  # the command's summary says it, on its first line
            epochs = engine.state.epoch
            rank_zero_print(f"TRAINING COMPLETE after {epochs} epoch{'' if epochs == 1 else 's'}")

    def finish(self, failed=False):
        """Finish every backend, even when one of them raises, then forget them all."""
        errors = []
        try:
            self._write_points(now=True)
        except Exception as err:
            errors.append((__name__, err))
        for backend in self.sinks:
            try:
                backend.finish(failed=failed)
            except Exception as err:
                errors.append((type(backend).__module__, err))
        self.backends, self._implicit = [], []
        # After a crash the crash is what propagates; a clean run surfaces the first error.
        raised = errors[0][1] if errors and not failed else None
        for module, err in errors:
            if err is not raised:
                warnings.warn(
                    f"logging backend {module!r} did not finish cleanly: {err!r}", stacklevel=2
                )
        if raised is not None:
            raise raised
