"""What a trainer checkpoints and when: the objects saved, the latest and best handlers, resume.

Where the files go, how they are named, indexed, written and read is the run directory's
business (``gatle_ignite.run``); this module only hands it the trainer's objects.
"""

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import ignite.distributed as idist
import torch
from ignite.engine import Events
from ignite.handlers import Checkpoint, global_step_from_engine

from gatle_ignite.callbacks.run_record import config_payload
from gatle_ignite.config.base import base_config
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.directory import eval_checkpoint, latest_checkpoint
from gatle_ignite.run.exact_resume import ResumableLoader, ResumeState
from gatle_ignite.run.layout import LATEST_ITER_PREFIX, LATEST_PREFIX, best_prefix_for
from gatle_ignite.run.loading import (
    RUN_IDENTITY_KEY,
    RunIdentity,
    RunMeta,
    load_weights,
    restore,
)
from gatle_ignite.run.model_fit import misfit_message, recorded_changes, tensor_differences
from gatle_ignite.run.saving import BackgroundWrites, RunSaver
from gatle_ignite.run.storage import is_url, local_dir, place_of
from gatle_ignite.run.unchanged_state import LastWrite
from gatle_ignite.trainer.accepted_changes import (
    apply_accepted_changes,
    fresh_settings,
    schedule_epochs,
)
from gatle_ignite.trainer.epoch_metrics import EPOCH_METRICS_KEY, EpochMetrics
from gatle_ignite.trainer.handlers import clear_state, ends_epoch
from gatle_ignite.trainer.strategy import ModelState, OptimizerState, is_sharded, strategy_of
from gatle_ignite.trainer.telemetry.stopwatch import Stopwatch
from gatle_ignite.utils.batch import get_value
from gatle_ignite.utils.dist import rank_zero_print

__all__ = [
    "attach_checkpoint_writes",
    "attach_checkpoints",
    "check_warm_start",
    "load_checkpoints",
    "load_eval_checkpoint",
    "save_iteration_checkpoint",
    "score_function",
]


def _stateful_schedulers(scheduler) -> list:
    schedulers = scheduler if isinstance(scheduler, (list, tuple)) else [scheduler]
    stateful = []
    for s in schedulers:
        if hasattr(s, "state_dict"):
            stateful.append(s)
        else:
            warnings.warn(
                f"scheduler {type(s).__name__} has no state_dict, so its learning-rate state is "
                f"not checkpointed and restarts on resume.",
                stacklevel=3,
            )
    return stateful


def _to_save(trainer) -> dict:
    """Every object a checkpoint holds, in the order the contract fixes.

    Under FSDP the model and optimizer go through torch's state-dict API, keyed by parameter
    name, so a sharded checkpoint reshards to another world size.
    """
    sharded = strategy_of(trainer.cfg) == "fsdp"
    to_save = {
        "model": ModelState(trainer.model) if sharded else trainer.model,
        "optimizer": OptimizerState(trainer.model, trainer.optimizer)
        if sharded
        else trainer.optimizer,
        "trainer": trainer.engines["trainer"],
        "run_meta": RunMeta(trainer.cfg.max_epochs),
    }
    to_save.update(trainer._early_stoppers)
    if trainer.scaler is not None:
        to_save["scaler"] = trainer.scaler
    if trainer.scheduler is not None:
        stateful = _stateful_schedulers(trainer.scheduler)
        if len(stateful) == 1:
            to_save["scheduler"] = stateful[0]
        else:
            to_save.update({f"scheduler_{i}": s for i, s in enumerate(stateful)})
    if getattr(trainer, "_resumable", None) is not None:
        to_save["resume_state"] = ResumeState(trainer._resumable)
    for key, obj in trainer.extra_to_save().items():
        if key in to_save or key in (EPOCH_METRICS_KEY, RUN_IDENTITY_KEY):
            raise ConfigError(
                f"extra_to_save() key '{key}' collides with the framework's own '{key}'.\n"
                f"  Rename it in extra_to_save()."
            )
        to_save[key] = obj
    return to_save


def score_function(score_name, score_factor=1):
    """A function of an eval engine giving the score to maximise."""

    def score(engine):
        return score_factor * float(get_value(engine.state.metrics, score_name))

    return score


class _TimedCheckpoint(Checkpoint):
    """ignite's Checkpoint, timing each call: the loop's stall for a checkpoint write."""

    def __init__(self, *args, stopwatch: Stopwatch, **kwargs):
        super().__init__(*args, **kwargs)
        self.stopwatch = stopwatch

    def __call__(self, engine) -> None:
        with self.stopwatch:
            super().__call__(engine)


class _Handlers:
    """Builds the run's Checkpoint handlers, each continuing its kind's rotation on resume."""

    def __init__(self, trainer, to_save):
        self.trainer = trainer
        self.run_dir = getattr(trainer, "run_dir", None)
        plan = self.run_dir.plan if self.run_dir is not None else None
        # Written beside what _to_save holds, never restored: which run wrote the file.
        identity = {RUN_IDENTITY_KEY: RunIdentity(plan.run_id)} if plan and plan.run_id else {}
        self.to_save = {**to_save, **identity}
        # Shared by every saver, so a latest file can link to the best file just written.
        self.last_write = LastWrite()
        self.sharded = strategy_of(trainer.cfg) == "fsdp"
        # Background writes: one queue for the run, and for sharded ones a process group of
        # their own, so DCP's collectives never meet the training's.
        self.writes = BackgroundWrites() if trainer.cfg.get("async_save", False) else None
        self.group = None
        if self.writes is not None and self.sharded and idist.get_world_size() > 1:
            self.group = torch.distributed.new_group(backend="gloo")
        trainer._writes = self.writes

    def build(
        self, prefix: str, kind: str, engine: str = "", also_save=None, **options
    ) -> Checkpoint:
        cfg = self.trainer.cfg
        run_dir = self.run_dir
        place = run_dir.place if run_dir is not None else place_of(local_dir(cfg.save_dir))
        saver = RunSaver(
            place.path, self.last_write, self._record, self.writes, self.group, place=place
        )
        to_save = {**self.to_save, **(also_save or {})}
        handler = _TimedCheckpoint(
            to_save,
            saver,
            n_saved=cfg.n_saved,
            filename_prefix=prefix,
            stopwatch=self.trainer._checkpoint_time,
            **options,
        )
        if self.sharded:
            handler.ext = "dcp"
        self._continue_rotation(handler, saver, kind, engine)
        return handler

    def _record(self, filename, metadata, removed) -> None:
        if self.run_dir is not None:
            self.run_dir.record_saved(filename, metadata, removed, self.trainer.engines["trainer"])

    def _continue_rotation(self, handler, saver, kind, engine) -> None:
        """Hand the handler the files of its kind an earlier process of this run wrote.

        Beyond ``n_saved`` (it was lowered), the lowest are removed after the next write.
        """
        if self.run_dir is None:
            return
        key = {LATEST_PREFIX: "epoch", LATEST_ITER_PREFIX: "iteration", "best": "score"}[kind]
        entries = [e for e in self.run_dir.entries(kind, engine) if getattr(e, key) is not None]
        items = sorted((getattr(e, key), e.file) for e in entries)
        keep = len(items) if handler.n_saved is None else handler.n_saved
        for _priority, filename in items[: max(len(items) - keep, 0)]:
            saver.remove(filename)
        handler.load_state_dict({"_saved": items[len(items) - min(keep, len(items)) :]})


def attach_checkpoints(trainer) -> None:
    """Build the latest and best handlers; fit() and run_eval_engine() call them."""
    trainer._post_eval = {}
    trainer._latest = None
    trainer._latest_iter = None
    trainer._epoch_metrics = None
    trainer._resumable = None
    # The time the loop stands still in checkpoint handlers, for the epochs' perf/ records.
    trainer._checkpoint_time = Stopwatch()
    cfg = trainer.cfg
    if "run" in cfg:
        return
    # A run beside another run in save_dir (RunDirectory._scratch) saves nothing either.
    saves = cfg.save_ckpt and trainer._keeps_files()
    if saves:
        trainer._resumable = ResumableLoader(lambda: trainer.dls["train"])
    handlers = _Handlers(trainer, _to_save(trainer)) if saves else None
    for spec in trainer.eval_specs():
        if spec.score_field is None:
            continue
        _attach_best(
            trainer,
            spec,
            score_name=cfg.get(spec.score_field, None),
            score_factor=cfg.get(spec.score_factor_field, 1),
            handlers=handlers,
        )
    if handlers is None:
        return
    trainer_engine = trainer.engines["trainer"]
    trainer._latest = handlers.build(
        LATEST_PREFIX,
        LATEST_PREFIX,
        global_step_transform=global_step_from_engine(trainer_engine),
    )
    # Mid-epoch checkpoints (save_every_iters, preemption), named by the trainer iteration;
    # they also hold the epoch's metrics so far.
    trainer._epoch_metrics = EpochMetrics(
        trainer_engine, lambda: trainer._metric_names.get(trainer.train_spec().key, {})
    )
    trainer._latest_iter = handlers.build(
        LATEST_ITER_PREFIX,
        LATEST_ITER_PREFIX,
        also_save={EPOCH_METRICS_KEY: trainer._epoch_metrics},
        global_step_transform=lambda _engine, _event: trainer_engine.state.iteration,
    )


def attach_checkpoint_writes(trainer) -> None:
    """Write "latest" at every epoch's end, and mid-epoch every ``save_every_iters``."""
    engine = trainer.engines["trainer"]
    if trainer._latest is not None:
        engine.add_event_handler(Events.EPOCH_COMPLETED, clear_state)

        def save_latest(engine):
            if not trainer._diverged:
                trainer._latest(engine)

        engine.add_event_handler(Events.EPOCH_COMPLETED, save_latest)
    every = trainer.cfg.get("save_every_iters", 0) or 0
    if trainer._latest_iter is not None and every > 0:
        engine.add_event_handler(
            Events.ITERATION_COMPLETED(every=every),
            lambda engine: save_iteration_checkpoint(trainer, engine),
        )


def save_iteration_checkpoint(trainer, engine):
    """Write this iteration's mid-epoch checkpoint (once), after a non-finite check.

    Returns its path, or None when nothing is saved: no handler, a diverged run, or an epoch's
    last iteration, whose own checkpoint comes after its evaluation instead.
    """
    if trainer._latest_iter is None:
        return None
    check = trainer._nan_check
    if (check is not None and check.check_now(engine)) or trainer._diverged or ends_epoch(engine):
        return None
    saved = trainer._latest_iter.last_checkpoint
    if saved is None or not Path(saved).stem.endswith(f"_{engine.state.iteration}"):
        trainer._latest_iter(engine)
    return trainer._latest_iter.last_checkpoint


def _attach_best(trainer, spec, score_name, score_factor, handlers) -> None:
    if trainer.engines.get(spec.key) is None or not score_name:
        return
    trainer_engine = trainer.engines["trainer"]
    best = None
    if handlers is not None:
        best = handlers.build(
            best_prefix_for(spec.ckpt_prefix),
            "best",
            engine=spec.engine_type,
            score_function=score_function(score_name, score_factor),
            score_name=None,
            global_step_transform=global_step_from_engine(trainer_engine),
            # 0.4's rule, which projects rely on: a tie moves the file to the newest epoch.
            # Early stopping still counts a tie as no improvement.
            greater_or_equal=True,
        )

    def check_then_save(engine):
        if trainer._diverged:
            return
        value = float(get_value(engine.state.metrics, score_name))
        if idist.get_world_size() > 1:
            value = float(idist.all_reduce(value))
        if math.isfinite(value):
            if best is not None:
                best(engine)
            return
        warnings.warn(
            f"training stopped: {score_name} is {value} at epoch {trainer_engine.state.epoch}; "
            f"not saved as best.\n"
            f"  The run has probably diverged: check the loss and the learning rate.",
            stacklevel=2,
        )
        trainer._diverged = True
        trainer_engine.terminate()

    trainer._post_eval.setdefault(spec.key, []).append(check_then_save)


def check_warm_start(cfg) -> None:
    """Refuse a ``model_checkpoint_dir`` that names no checkpoint file (or ``.dcp`` directory)."""
    source = Path(cfg.model_checkpoint_dir)
    if not (source.is_file() or (source.suffix == ".dcp" and source.is_dir())):
        raise ConfigError(
            f"model_checkpoint_dir {cfg.model_checkpoint_dir!r} is not a file.\n"
            f"  Despite its name it takes a checkpoint FILE, e.g. "
            f"<save_dir>/latest_epoch_checkpoint_3.pt."
        )


def load_checkpoints(trainer) -> bool:
    """Warm-start weights and/or resume a run; returns whether anything was loaded."""
    cfg = trainer.cfg
    loaded = False
    if cfg.model_checkpoint_dir:
        check_warm_start(cfg)
        rank_zero_print(f"LOADING MODEL FROM: {cfg.model_checkpoint_dir}")
        load_weights(cfg.model_checkpoint_dir, trainer.model, strict=cfg.strict)
        loaded = True
    if cfg.resume:
        loaded = _resume(trainer) or loaded
    return loaded


def _resume(trainer) -> bool:
    """Resume from the checkpoint the run directory chose (the furthest-trained that loads)."""
    run_dir = getattr(trainer, "run_dir", None)
    if run_dir is not None:
        chosen = run_dir.resume_checkpoint()
        accepted = run_dir.plan.accepted
    else:
        # Called outside fit() (a script): the same choice, read-only.
        chosen, accepted = latest_checkpoint(trainer.cfg.save_dir), []
    if chosen is None:
        return False
    path, state = chosen
    rank_zero_print(f"RESUMING FROM: {path}")
    _resume_from(trainer, state, accepted)
    return True


def _resume_from(trainer, state, accepted=()) -> None:
    objects = _to_save(trainer)
    missing = sorted(key for key in objects if key not in state)
    if missing:
        warnings.warn(f"checkpoint has no state for {missing}; resuming without it.", stacklevel=3)
    present = {key: obj for key, obj in objects.items() if key in state}
    _warn_if_epoch_length_changed(trainer, state.get("trainer", {}))
    fresh = fresh_settings(trainer, present, schedule_epochs(state, accepted)) if accepted else None
    for key in fresh["replayed"] if fresh else ():
        present.pop(key)
    try:
        restore(_targets(trainer, present, state), state)
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        if not accepted:
            raise
        first = str(error).splitlines()[0]
        raise ConfigError(
            f"the checkpoint does not fit the trainer built from the changed config "
            f"(accepted: {', '.join(accepted)}): {first}\n"
            f"  A change of shape (the model, the optimizer's parameter groups) cannot be "
            f"resumed; start a new run from its weights with model_checkpoint_dir instead."
        ) from error
    epoch_metrics = getattr(trainer, "_epoch_metrics", None)
    if epoch_metrics is not None and EPOCH_METRICS_KEY in state:
        restore({EPOCH_METRICS_KEY: epoch_metrics}, state)
    if fresh is not None:
        apply_accepted_changes(trainer, fresh, accepted)
    _keep_the_schedules_length(trainer, objects["run_meta"].restored_max_epochs, accepted)


def _targets(trainer, objects: dict, state, strict: bool = True) -> dict:
    """``objects`` to load ``state`` into: the model and optimizer through torch's state-dict
    API when either side is sharded, whatever the run's strategy."""
    if not (hasattr(state, "restore") or is_sharded(trainer.model)):
        return objects
    targets = dict(objects)
    if "model" in targets and not isinstance(targets["model"], ModelState):
        targets["model"] = ModelState(trainer.model, strict)
    if "optimizer" in targets and not isinstance(targets["optimizer"], OptimizerState):
        targets["optimizer"] = OptimizerState(trainer.model, trainer.optimizer)
    return targets


def _keep_the_schedules_length(trainer, restored, accepted) -> None:
    """Say that a restored schedule keeps the length it was built for, and have the run's
    later checkpoints record that length, not this config's max_epochs."""
    max_epochs = trainer.cfg.max_epochs
    if trainer.scheduler is None or restored in (None, max_epochs) or "max_epochs" in accepted:
        return
    if trainer._latest is not None:
        # The handlers share one to_save; its RunMeta is what each checkpoint records.
        trainer._latest.to_save["run_meta"].max_epochs = restored
    warnings.warn(
        f"resuming a run made for max_epochs={restored} with max_epochs={max_epochs}: the "
        f"learning-rate schedule keeps its {restored}-epoch length (past its end the built-in "
        f"cosine schedules stay at their floor).\n"
        f"  To fit it to {max_epochs} epochs, --override \"accept_changes=['max_epochs']\" "
        f"(the lr moves to where a {max_epochs}-epoch schedule is at this point), or start "
        f"fresh from the weights: resume=False, model_checkpoint_dir=<a latest_epoch "
        f"checkpoint>.",
        stacklevel=4,
    )


def _warn_if_epoch_length_changed(trainer, engine_state) -> None:
    saved = engine_state.get("epoch_length")
    try:
        now = trainer.cfg.train_length or len(trainer.dls["train"])
    except TypeError:
        return
    if saved is not None and saved != now:
        warnings.warn(
            f"the checkpoint's epochs have {saved} iterations and this run's have {now}; ignite "
            f"keeps {saved} for the rest of the run.\n"
            f"  Resume with the train_length and data the run was started with, or start fresh "
            f"(resume=False, model_checkpoint_dir=<the checkpoint>).",
            stacklevel=4,
        )


def _misfit(trainer, ckpt, state) -> Optional[ConfigError]:
    """The error for a checkpoint whose model differs from the one the config built, naming
    the tensors and the config fields that differ; None when that is not why it failed."""
    saved = state.get("model") if isinstance(state, dict) else None
    if not isinstance(saved, Mapping):
        return None
    model = getattr(trainer.model, "module", trainer.model)
    differences = tensor_differences(saved, model.state_dict())
    if not differences:
        return None
    payload, defaults = config_payload(trainer.cfg), config_payload(base_config())
    # The run the checkpoint belongs to: its directory, or for a URL that run's read cache.
    ckpt = str(ckpt)
    run_dir = place_of(ckpt.rsplit("/", 1)[0]).path if is_url(ckpt) else Path(ckpt).parent
    changes = recorded_changes(run_dir, payload, defaults)
    return ConfigError(misfit_message(ckpt, differences, changes))


def load_eval_checkpoint(trainer):
    """Load the weights (and extra state) that ``gatle-ignite eval`` evaluates."""
    cfg = trainer.cfg
    which = cfg.get("load_from_ckpt", "best")
    chosen = eval_checkpoint(cfg.save_dir, which, prefix="valid_")
    if chosen is None:
        raise ConfigError(
            f"no {which!r} checkpoint found in {cfg.save_dir}\n"
            f"  Train first, or point save_dir at a run directory."
        )
    ckpt, state = chosen
    rank_zero_print(f"LOADING CHECKPOINT: {ckpt}")
    try:
        restore(_targets(trainer, {"model": trainer.model}, state, cfg.strict), state, cfg.strict)
    except RuntimeError as error:
        explained = _misfit(trainer, ckpt, state)
        if explained is None:
            raise
        raise explained from error
    for key, obj in trainer.extra_to_save().items():
        if key in state:
            restore({key: obj}, state)
        else:
            warnings.warn(
                f"{ckpt} has no '{key}'; evaluating with a freshly built '{key}'. This is "
                f"expected for checkpoints written before extra_to_save() returned it.",
                stacklevel=2,
            )
    return ckpt
