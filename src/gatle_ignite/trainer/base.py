"""BaseTrainer: the training loop, so a task does not have to contain one."""

import contextlib
import warnings
from functools import partial

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events

from gatle_ignite.callbacks.backends.text import format_value
from gatle_ignite.callbacks.logging import tell
from gatle_ignite.config.validate import validate_config
from gatle_ignite.data.helpers import get_aug, get_dataset, warn_if_eval_padded
from gatle_ignite.dispatch import ConfigError, call_with_params, import_entrypoint
from gatle_ignite.enhancements.compile import check_build_model_override, compile_built_model
from gatle_ignite.enhancements.early_stop import build_early_stoppers
from gatle_ignite.losses.reading import params_field
from gatle_ignite.optimizers.grouping import param_group_names
from gatle_ignite.run.directory import RunDirectory
from gatle_ignite.schedulers import attach_scheduler, prep_scheduler
from gatle_ignite.specs import EVAL_SPECS, TRAIN_SPEC, metrics_field_of
from gatle_ignite.trainer.checkpointing import (
    attach_checkpoint_writes,
    attach_checkpoints,
    load_checkpoints,
    load_eval_checkpoint,
    score_function,
)
from gatle_ignite.trainer.checks import (
    check_not_empty,
    check_prepared,
    check_scores,
    explain_forward_error,
    explain_output_error,
    note_library_error,
)
from gatle_ignite.trainer.handlers import LossAverage, NonFiniteCheck, clear_state, empty_cuda_cache
from gatle_ignite.trainer.lifecycle import attach_preemption_stop, recorded_run
from gatle_ignite.trainer.model_graph import attach_model_graph
from gatle_ignite.trainer.preemption import ONE_PROCESS_CTRL_C, preemption_signals, stop_at_once
from gatle_ignite.trainer.progress import attach_progress_output, epoch_length_of
from gatle_ignite.trainer.strategy import ddp_params, distribute, gradient_sync, strategy_of
from gatle_ignite.trainer.telemetry.epochs import Telemetry
from gatle_ignite.utils.amp import autocast_device_type, resolve_amp_dtype
from gatle_ignite.utils.dist import quiet_ignite_loggers, rank_zero_print
from gatle_ignite.utils.seed import setup_seed

__all__ = ["BaseTrainer"]


class BaseTrainer:
    """The training loop, so your task does not have to contain one.

    Subclass it and implement ``prep_batch``; engines, metrics, checkpointing, resume, logging,
    AMP and DDP are handled here and driven by the config. Point ``cfg.main_runner`` at the
    module holding it: the launcher constructs ``Trainer(local_rank, cfg)`` and calls ``fit()``.
    """

    def __init__(self, local_rank, cfg):
        self.local_rank = local_rank
        self.cfg = cfg
        validate_config(cfg, specs=self.eval_specs())
        quiet_ignite_loggers(cfg.get("verbosity", 1))
        setup_seed(cfg.seed, cudnn_benchmark=cfg.cudnn_benchmark)
        self.dtype, self.autocast_enabled = resolve_amp_dtype(cfg.amp_dtype)
        self.device_type = autocast_device_type()
        # This rank's device, for a task that creates tensors (torch.randn in a sampler).
        self.device = idist.device()
        self.model = None
        # What build_model resolved cfg.compile to; None until it has run.
        self._compiling = None
        self.criterion = None
        self.optimizer = None
        self.scheduler = None
        self.scaler = None
        self.logger = None
        self.grad_clip_norm = None
        self.grad_clip_value = None
        self.accum_steps = 1
        self.transform = None
        self.dls = {}
        self.infos = {}
        self.engines = {}
        # engine key -> handlers run after that engine's run() returns, outside eval_context.
        self._post_eval = {}
        # The "latest" Checkpoint that attach_checkpoints builds and fit() registers, or None.
        self._latest = None
        # Set when a loss or a score goes non-finite, so nothing after it is saved.
        self._diverged = False
        # checkpoint key -> EarlyStop. setup() fills it before anything is checkpointed.
        self._early_stoppers = {}
        # engine key -> the names of the metrics attach_metrics attached to it.
        self._metric_names = {}
        # The run directory fit() opens; the run's non-finite check and preemption stop.
        self.run_dir = self._nan_check = self._preemption = None
        # (state, reason) for run.json when a handler attached from outside (a sweep's pruning)
        # ended the run.
        self._stopped_from_outside = None
        # trainer/checkpointing's: the mid-epoch "latest" (save_every_iters, preemption), the
        # loader wrapper that resumes at any iteration, what an iteration checkpoint keeps of
        # the epoch metrics, the background writes (async_save), the stopwatch the telemetry
        # reads, and the run directory they were built for (None before fit() opened one).
        self._latest_iter = self._resumable = self._epoch_metrics = None
        self._writes = self._checkpoint_time = self._checkpoints_for = None
        # Where the run's time goes (the perf/ records), attached by fit().
        self._telemetry = None
        self._built = False

    # ---- Hooks: what a task writes ----

    def prep_batch(self, batch, split="train", **kwargs):
        """Map a raw batch to ``{"model_input": {...}, "targets": {...}}``.

        ``model_input`` is splatted into the model's forward; the whole dict is what losses and
        metrics select from. ``split`` is the engine's ``engine_type``.
        """
        raise NotImplementedError(
            f'{type(self).__name__} must implement prep_batch(batch, split="train") '
            'returning {"model_input": {...}, "targets": {...}}'
        )

    def eval_specs(self):
        """The eval engines, as data. Override to add one:

        ``return super().eval_specs() + (EngineSpec.for_split("probe"),)``
        """
        return EVAL_SPECS

    def train_spec(self):
        """The training engine, as data; ``replace(..., total_loss=False)`` for a GAN."""
        return TRAIN_SPEC

    @contextlib.contextmanager
    def eval_context(self, spec):
        """Model state for one engine's run (an EMA swap); restore it in ``finally``."""
        yield

    def run_eval_engine(self, spec):
        """Run one eval engine inside its eval_context, then its post-eval handlers outside."""
        engine = self.engines.get(spec.key)
        if engine is None or self.dls.get(spec.split) is None:
            return None
        with self.eval_context(spec):
            engine.run(self.dls[spec.split], max_epochs=1, epoch_length=spec.length(self.cfg))
        # Reached only on success: a failed evaluation must not select a checkpoint.
        for handler in self._post_eval.get(spec.key, ()):
            handler(engine)
        return engine.state.metrics

    def forward(self, model_input):
        """Run the model on ``model_input``, splatted as keyword arguments."""
        return self.model(**model_input)

    def build_model(self):
        """Build THE model: the one DDP-wrapped, optimised and checkpointed.

        A second model (a teacher, a discriminator) is built here too and held in a list, so it
        is never registered as a submodule.
        """
        Model = import_entrypoint(self.cfg.model_name, "Model", field="model_name")
        model = call_with_params(Model, self.cfg.model_params, "model_params")
        # In place on the unwrapped model, before the DDP wrap below.
        self._compiling = compile_built_model(model, self.cfg)
        if idist.get_world_size() == 1 or strategy_of(self.cfg) == "fsdp":
            # Not auto_model: with several GPUs visible it would wrap in DataParallel. FSDP
            # shards the model after build_model returns.
            return model.to(self.device)
        return idist.auto_model(model, **ddp_params(self.cfg, model))

    def dict_metric_from_list(self, engine_type, spec, dict_metrics, info=None):
        """Build one engine's metrics from the config; keys are ``{engine_type}/{key}``."""
        if not spec:
            return dict_metrics
        # Any mapping: ml_collections turns an assigned dict into a ConfigDict.
        if not hasattr(spec, "items"):
            raise ConfigError(
                f"{engine_type} metrics must be a mapping of name -> {{'cls_name', 'params'}}, "
                f"got {type(spec).__name__}.\n"
                f"  To build metrics imperatively instead, override dict_metric_from_list()."
            )
        field = metrics_field_of(engine_type, (self.train_spec(), *self.eval_specs()))
        for key, entry in spec.items():
            if "cls_name" not in entry:
                raise ConfigError(f"metric entry {key!r} is missing 'cls_name'")
            get_metric = import_entrypoint(
                entry["cls_name"], "get_metric", field=f"{field}.{key}.cls_name"
            )
            # A built-in's messages name the field its src_name and tgt_name come from.
            with params_field(f"{field}.{key}.params"):
                dict_metrics[f"{engine_type}/{key}"] = get_metric(
                    engine_type, info or {}, **entry.get("params", {})
                )
        return dict_metrics

    # ---- Steps: overridable, the defaults suit most supervised tasks ----

    def loss_fn(self, y_pred, target, **kwargs):
        """``(total loss, {"loss_<key>": tensor})`` from the criterion.

        A criterion that is one loss term (a built-in named as ``criterion_name``) returns a
        bare tensor: the total, with no component of its own.
        """
        result = self.criterion(y_pred, target, **kwargs)
        if isinstance(result, torch.Tensor):
            return result, {}
        return result

    def backward(self, loss, step=True):
        """Backward for one micro-batch; the optimizer step only when ``step`` ends a window.

        ``loss`` arrives already divided by the window. An override must honour ``step``.
        """
        model, optimizer = self.model, self.optimizer
        clipping = self.grad_clip_value is not None or self.grad_clip_norm is not None
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if not step:
                return
            if clipping:
                self.scaler.unscale_(optimizer)
                self._clip_grads(model)
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            loss.backward()
            if not step:
                return
            if clipping:
                self._clip_grads(model)
            optimizer.step()

    def _clip_grads(self, model):
        if self.grad_clip_value is not None:
            torch.nn.utils.clip_grad_value_(model.parameters(), self.grad_clip_value)
        if self.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip_norm)

    def train_step(self, engine, batch, split="train"):
        """One training micro-batch: forward and loss under autocast, backward, and the optimizer
        step when the batch ends an accumulation window."""
        engine.state.batch = None
        engine.state.output = None
        # An evaluation put it in eval mode; the flag check spares a module walk per step.
        if not self.model.training:
            self.model.train()
        window, is_first, is_step = self._accum_window(engine)
        if is_first:
            self.optimizer.zero_grad(set_to_none=True)
        # no_sync covers the forward too: DDP decides during forward whether to all-reduce.
        with self._maybe_no_sync(is_step):
            x = self.prep_batch(batch, split=split)
            check_prepared(x, split)
            with self._autocast():
                y_pred = self._forward_explained(x["model_input"])
                loss, dict_losses = self._loss_explained(y_pred, x, engine.state.iteration)
            # By the window, not accum_steps: an epoch's last window can be shorter.
            self.backward(loss / window if window > 1 else loss, step=is_step)
        # The undivided loss is reported, so train/loss_avg compares across accum_steps.
        return {"y_pred": y_pred, "target": x, "losses": {"loss": loss, **dict_losses}}

    def _accum_window(self, engine):
        """``(window size, first in window, ends the window)``; windows never cross epochs."""
        accum = self.accum_steps
        if accum == 1:
            return 1, True, True
        length = engine.state.epoch_length or 1
        index = (engine.state.iteration - 1) % length
        start = (index // accum) * accum
        window = min(accum, length - start)
        return window, index == start, index == start + window - 1

    def _autocast(self):
        if not self.autocast_enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def _maybe_no_sync(self, is_step):
        return gradient_sync(self.model, is_step)

    def eval_step(self, engine, batch, split="valid"):
        """One evaluation batch: forward under ``no_grad`` and autocast; no loss."""
        engine.state.batch = None
        engine.state.output = None
        if self.model.training:
            self.model.eval()
        x = self.prep_batch(batch, split=split)
        check_prepared(x, split)
        with torch.no_grad(), self._autocast():
            y_pred = self._forward_explained(x["model_input"])
        return {"y_pred": y_pred, "target": x}

    def _forward_explained(self, model_input):
        """``forward``; a model refusing the ``model_input`` keys says so in one error, and an
        error raised inside the library the model comes from names the config that built it."""
        try:
            return self.forward(model_input)
        except Exception as error:
            problem = explain_forward_error(self.model, model_input, error, self.prep_batch)
            if problem is not None:
                raise problem from error
            note_library_error(error, self.cfg, self.model, model_input)
            raise

    def _loss_explained(self, y_pred, target, iteration):
        """``loss_fn``; one failing to read a model output that is no dict says so in one error."""
        try:
            return self.loss_fn(y_pred, target, iteration=iteration)
        except (IndexError, KeyError, TypeError) as error:
            problem = explain_output_error(y_pred)
            if problem is None:
                raise
            raise problem from error

    # ---- Framework below: a task never needs to touch it ----

    def setup(self):
        """Build everything. Idempotent, so fit() and evaluate() can both call it.

        It opens no run: a script may build the trainer of a finished run to inspect it, and
        fit() decides what happens to the run in save_dir.
        """
        if self._built:
            return self
        cfg = self.cfg
        if "run" not in cfg:
            from gatle_ignite.callbacks.logging import LoggingCallback

            self.logger = LoggingCallback(cfg)
            self.logger.start_in(self.run_dir)
        self.build_dataloaders()
        for split, loader in self.dls.items():
            if loader is not None:
                check_not_empty(split, loader)
        self.model = self.build_model()
        # An overridden build_model owns compilation, so check that it did compile.
        check_build_model_override(self.model, getattr(self, "_compiling", None), cfg)
        # Activation checkpointing and FSDP sharding, before the optimizer sees the parameters.
        self.model = distribute(self.model, cfg, self.dtype, self.autocast_enabled)
        self.build_criterion()
        self.build_optimizer()
        self.build_engines()
        self.build_scheduler()
        self.attach_metrics()
        # Before attach_checkpoints, which saves their counters. Inference mode never trains.
        if "run" not in cfg:
            self._early_stoppers = build_early_stoppers(
                self.eval_specs(), self.engines, cfg, score_function
            )
        attach_checkpoints(self)
        self._checkpoints_for = self.run_dir
        self._built = True
        return self

    def fit(self):
        """Train: open the run directory, set up, load (weights, resume), run, record the end."""
        if self.run_dir is None:
            self.run_dir = RunDirectory.opened(self.cfg)
        if not self.run_dir.is_open:
            rank_zero_print(self.run_dir.plan.message)
            return self
        cfg = self.cfg
        # One process owns its Ctrl-C: a second stops it at once. A rank of several takes
        # repeats as one request, and its launcher acts on a second one. Around the teardown
        # too, so a second Ctrl-C there stops without a traceback.
        one_process = idist.get_world_size() == 1
        with preemption_signals(
            on_request=self._on_stop_request,
            on_repeat=stop_at_once if one_process else None,
            ctrl_c_note=ONE_PROCESS_CTRL_C if one_process else None,
        ):
            with recorded_run(self):
                self.setup()
                # Here, not in setup(): a 0.4 script builds a task to inspect it, never to train.
                check_scores(cfg, self.eval_specs(), self._metric_names)
                self._join_run()
                load_checkpoints(self)
                trainer = self.engines["trainer"]
                if cfg.resume:
                    # What was logged after the checkpoint is trained again: logged once.
                    tell(self.logger, "rewind", trainer.state.iteration)
                self._telemetry = Telemetry(self)
                # First at an epoch's end, so its training time stops before anything else.
                self._telemetry.attach_clocks(self.engines)
                attach_model_graph(self, self._telemetry.overhead)
                self.attach_runner()
                # After the eval runners, so "latest" holds what that epoch's evaluation changed.
                attach_checkpoint_writes(self)
                # After the checkpoint writes, so an epoch's perf/ record includes them.
                self._telemetry.attach_record(trainer)
                for stopper in self._early_stoppers.values():
                    # Under the epoch's block and its perf line: the decision they lead to.
                    trainer.add_event_handler(Events.EPOCH_COMPLETED, stopper.announce)
                # Last: a request stops the run after the iteration's or the epoch's checkpoints.
                self._preemption = attach_preemption_stop(self)
                self.attach_progress()
                data = self._resumable if self._resumable is not None else self.dls["train"]
                trainer.run(data, max_epochs=cfg.max_epochs, epoch_length=cfg.train_length)
        return self

    def _on_stop_request(self):
        # A request made while the run is set up is taken when the preemption stop attaches.
        if self._preemption is not None:
            self._preemption.on_signal()

    def _join_run(self):
        """Bind what setup() built to the run fit() opened: the logger's sinks, the param
        groups' names, and the checkpoint handlers when a script's setup() came first."""
        tell(self.logger, "start_in", self.run_dir)
        groups = param_group_names(self.optimizer)
        self.run_dir.note_lr_groups(groups)
        tell(self.logger, "name_lr_groups", groups)
        if self._checkpoints_for is not self.run_dir:
            attach_checkpoints(self)
            self._checkpoints_for = self.run_dir

    def evaluate(self, load_checkpoint=True):
        """Load the configured checkpoint, run every eval engine once, return the metrics."""
        cfg = self.cfg
        if "run" not in cfg:
            raise ConfigError(
                "evaluate() needs inference mode, or checkpoint handlers could overwrite what "
                "it evaluates.\n"
                "  Use `gatle-ignite eval --config=...`, or set cfg.run = True before building "
                "the trainer."
            )
        self.setup()
        if load_checkpoint:
            load_eval_checkpoint(self)
        results = {}
        for spec in self.eval_specs():
            metrics = self.run_eval_engine(spec)
            if metrics:
                results.update(metrics)
        for name, value in results.items():
            # As the epoch blocks of training show it.
            rank_zero_print(f"{name}: {format_value(value)}")
        return results

    def teardown(self, failed=False):
        """Close every logging backend, marking the run failed when it was."""
        tell(self.logger, "finish", failed=failed)

    def build_dataloaders(self):
        """One dataloader per declared engine, from each spec's ``<split>_ds_name``.

        Override to add a loader belonging to no engine; call ``super()`` first.
        """
        cfg = self.cfg
        self.transform = get_aug(cfg.aug_name, cfg.aug_params)
        self.dls["train"], self.infos["train"] = get_dataset(
            cfg.train_ds_name, cfg.train_ds_params, self.transform, field="train_ds_name"
        )
        for spec in self.eval_specs():
            split = spec.split
            # Two specs may share a split through ds_prefix; build its loader once.
            if split in self.dls:
                continue
            name = cfg.get(f"{split}_ds_name", None)
            if not name:
                self.dls[split], self.infos[split] = None, None
                continue
            # Under DDP a DistributedSampler pads an uneven eval set and scores the duplicates.
            ds_params = dict(cfg.get(f"{split}_ds_params", {}))
            ds_params.setdefault("exact_sharding", True)
            self.dls[split], self.infos[split] = get_dataset(
                name, ds_params, self.transform, field=f"{split}_ds_name"
            )
            self._warn_if_eval_padded(split, self.dls[split])
        return self.dls, self.infos

    # Under DDP a loader the framework could not shard exactly scores duplicates: say so.
    _warn_if_eval_padded = staticmethod(warn_if_eval_padded)

    def build_criterion(self):
        """Build ``Loss(**criterion_params)`` on the run's device."""
        Loss = import_entrypoint(self.cfg.criterion_name, "Loss", field="criterion_name")
        self.criterion = call_with_params(Loss, self.cfg.criterion_params, "criterion_params")
        self.criterion = self.criterion.to(self.device)
        return self.criterion

    def build_optimizer(self):
        """Build the optimizer; also the GradScaler (fp16 on CUDA), clipping and accumulation."""
        cfg = self.cfg
        get_optimizer = import_entrypoint(
            cfg.optimizer_name, "get_optimizer", field="optimizer_name"
        )
        self.optimizer = call_with_params(
            get_optimizer, cfg.optimizer_params, "optimizer_params", self.model
        )
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        rank_zero_print(f"MODEL: {trainable:,} trainable parameters")
        # Only fp16 needs a GradScaler: bf16 has fp32's exponent range.
        if self.dtype == torch.float16 and torch.cuda.is_available():
            self.scaler = torch.amp.GradScaler("cuda")
        self.grad_clip_norm = cfg.grad_clip_norm
        self.grad_clip_value = cfg.grad_clip_value
        self.accum_steps = self._resolve_accum_steps()
        return self.optimizer

    def _resolve_accum_steps(self):
        accum = self.cfg.get("accum_steps", 1)
        if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
            raise ConfigError(f"accum_steps must be an integer >= 1, got {accum!r}")
        if accum > 1 and type(self).train_step is not BaseTrainer.train_step:
            # Accumulation lives inside train_step, so an override skips it unless it copies it.
            warnings.warn(
                f"{type(self).__name__} overrides train_step, so accum_steps={accum} has no "
                f"effect unless the override accumulates too.\n"
                f"  Use _accum_window() there, and pass its `step` through to backward().",
                stacklevel=3,
            )
        return accum

    def build_engines(self):
        """One ignite Engine per spec; an eval engine that will never run is None."""
        specs = self.eval_specs()
        self._check_specs_are_distinct(specs)
        train_spec = self.train_spec()
        self.engines[train_spec.key] = self._engine_for(train_spec)
        for spec in specs:
            # Present even when unbuilt: callers ask `engines["tester"] is None`.
            self.engines[spec.key] = self._engine_for(spec) if self._wants(spec) else None
        return self.engines

    def _engine_for(self, spec):
        return Engine(partial(getattr(self, spec.step), split=spec.engine_type))

    def _wants(self, spec):
        if self.dls.get(spec.split) is None:
            return False
        # Built only if it will run; inference mode runs every engine, whatever its cadence.
        return spec.cadence(self.cfg) > 0 or "run" in self.cfg

    @staticmethod
    def _check_specs_are_distinct(specs):
        """Two engines sharing a key or an engine_type would silently overwrite each other."""
        for attr in ("key", "engine_type"):
            seen = [getattr(s, attr) for s in specs]
            dupes = sorted({v for v in seen if seen.count(v) > 1})
            if dupes:
                raise ConfigError(
                    f"eval_specs() has more than one engine with {attr} {dupes!r}. "
                    f"Each engine needs its own {attr}."
                )

    def build_scheduler(self):
        """Build the configured LR scheduler and attach it to the engine it names."""
        # The whole engines dict, so a schedule can follow any engine the task declared.
        scheduler, engine_name, event_name = prep_scheduler(
            self.cfg.lr_scheduler, self.cfg, self.dls["train"], self.optimizer, self.engines
        )
        # Where it is driven from, so a resume with an accepted change can replay it.
        self._scheduler_event = (engine_name, event_name)
        self.scheduler = attach_scheduler(scheduler, engine_name, event_name, self.engines)
        return self.scheduler

    def attach_metrics(self):
        """Attach each engine's config metrics (and the trainer's loss averages)."""
        for spec in (self.train_spec(), *self.eval_specs()):
            engine = self.engines.get(spec.key)
            if engine is None:
                continue
            self._metric_names[spec.key] = self.init_metrics(
                engine,
                spec.engine_type,
                self.cfg.get(spec.metrics_field, {}),
                info=self.infos.get(spec.split),
                with_losses=spec.with_losses,
                total_loss=spec.total_loss,
            )

    def init_metrics(
        self, engine, engine_type, metrics_cfg, info=None, with_losses=True, total_loss=True
    ):
        """Attach ``metrics_cfg``'s metrics and, with ``with_losses``, the loss averages."""
        dict_metrics = self.dict_metric_from_list(engine_type, metrics_cfg, {}, info=info)
        if with_losses:
            keys = ["loss"] if total_loss else []
            keys += [f"loss_{c}" for c in getattr(self.criterion, "crit_keys", [])]
            for key in keys:
                dict_metrics[f"{engine_type}/{key}_avg"] = LossAverage(key)
        for name, metric in dict_metrics.items():
            metric.attach(engine, name)
        return dict_metrics

    def extra_to_save(self):
        """Your own state for every checkpoint (objects with state_dict / load_state_dict).

        One override covers save, resume and ``gatle-ignite eval``.
        """
        return {}

    def attach_runner(self):
        """The training run's handlers: non-finite stop, logging, eval runs, early stopping."""
        trainer = self.engines["trainer"]
        # Stop at the first non-finite loss: the weights cannot recover from it. Checked first
        # at an epoch's end, before anything evaluates, saves or logs that epoch.
        length = epoch_length_of(self.cfg, self.dls["train"])
        self._nan_check = NonFiniteCheck.for_run(self.cfg, self.device, length, self._mark_diverged)
        self._nan_check.attach(trainer)
        tell(self.logger, "follow_losses", self._nan_check)
        tell(self.logger, "on_train_epoch_end", trainer, self.optimizer)
        tell(self.logger, "on_train_iteration", trainer, self.model)
        for spec in self.eval_specs():
            self._attach_eval_runner(trainer, spec)
        for stopper in self._early_stoppers.values():
            self._post_eval.setdefault(stopper.spec.key, []).append(stopper)
        # After the evaluations: one record per epoch, every engine's metrics together.
        tell(self.logger, "on_epoch_logged", trainer)
        tell(self.logger, "on_completion", trainer)

    def _mark_diverged(self):
        self._diverged = True

    def _attach_eval_runner(self, trainer, spec):
        engine = self.engines.get(spec.key)
        if engine is None:
            return

        # Its own method: inlined in the caller's loop, each handler would late-bind the last spec.
        @trainer.on(Events.EPOCH_COMPLETED(every=spec.cadence(self.cfg)))
        def _run(_trainer):
            if self._diverged:
                return
            clear_state(_trainer)
            self.run_eval_engine(spec)

        # Beside the handler that runs the engine, so no engine runs without being logged.
        tell(self.logger, "on_valid_epoch_end", trainer, engine)

    def attach_progress(self):
        """Progress reporting, memory cleanup, and the DDP sampler's epoch."""
        trainer = self.engines["trainer"]
        loss = (lambda: self._nan_check.last_loss) if self._nan_check is not None else None
        attach_progress_output(self.cfg, self.engines, self.eval_specs(), self.dls, loss)
        for engine in self.engines.values():
            if engine is not None:
                engine.add_event_handler(Events.EPOCH_STARTED, clear_state)
                engine.add_event_handler(Events.EPOCH_COMPLETED, empty_cuda_cache)
        sampler = getattr(self.dls["train"], "sampler", None)
        if hasattr(sampler, "set_epoch"):
            # DistributedSampler needs the epoch, or it replays the same shuffle every epoch.
            trainer.add_event_handler(
                Events.EPOCH_STARTED, lambda engine: sampler.set_epoch(engine.state.epoch)
            )
