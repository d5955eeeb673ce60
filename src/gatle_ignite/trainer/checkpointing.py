"""Checkpoints: what is saved, when latest and best files are written, and how runs resume."""

import math
import warnings
from pathlib import Path

import ignite.distributed as idist
from ignite.handlers import Checkpoint, DiskSaver, global_step_from_engine

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.trainer.exact_resume import ResumableLoader, ResumeState
from gatle_ignite.trainer.unchanged_state import LastWrite, snapshot
from gatle_ignite.utils.batch import get_value
from gatle_ignite.utils.checkpoints import (
    LATEST_ITER_PREFIX,
    LATEST_PREFIX,
    RunMeta,
    best_prefix_for,
    find_resume_checkpoints,
    load_checkpoint_file,
    load_weights,
    resolve_eval_checkpoint,
)
from gatle_ignite.utils.dist import rank_zero_print

__all__ = [
    "attach_checkpoints",
    "load_checkpoints",
    "load_eval_checkpoint",
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
    """Every object a checkpoint holds, in the order the contract fixes."""
    to_save = {
        "model": trainer.model,
        "optimizer": trainer.optimizer,
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
        if key in to_save:
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


class _KeepUntilReplaced(DiskSaver):
    """A DiskSaver that deletes a rotated-out file only once its replacement is on disk, and
    links a checkpoint to the run's last file instead of writing it when their state is the same.

    ignite removes the old file before writing the new one, so a process killed in between
    would leave no checkpoint of that kind at all. The link spares an improving epoch its second
    full write (best, then latest) and the disk its second copy.
    """

    def __init__(self, dirname, last_write: LastWrite):
        super().__init__(dirname=dirname, require_empty=False)
        self._rotated_out = []
        self._last_write = last_write

    def remove(self, filename: str) -> None:
        self._rotated_out.append(filename)

    def __call__(self, checkpoint, filename, metadata=None) -> None:
        if idist.has_xla_support or idist.get_rank() != self.save_on_rank:
            super().__call__(checkpoint, filename, metadata)
        else:
            path = Path(self.dirname) / filename
            state = snapshot(checkpoint)
            if not self._last_write.link_if_same(state, path):
                super().__call__(checkpoint, filename, metadata)
            self._last_write.remember(path, state)
        rotated_out, self._rotated_out = self._rotated_out, []
        for name in rotated_out:
            if name != filename:
                super().remove(name)


def _saver(cfg, last_write: LastWrite):
    return _KeepUntilReplaced(cfg.save_dir, last_write)


def attach_checkpoints(trainer) -> None:
    """Build the latest and best handlers; fit() and run_eval_engine() call them."""
    trainer._post_eval = {}
    trainer._latest = None
    trainer._latest_iter = None
    trainer._resumable = None
    cfg = trainer.cfg
    if "run" in cfg:
        return
    if cfg.save_ckpt:
        trainer._resumable = ResumableLoader(lambda: trainer.dls["train"])
    to_save = _to_save(trainer) if cfg.save_ckpt else None
    # Shared by every saver of the run, so a latest file can link to the best file just written.
    last_write = LastWrite()
    for spec in trainer.eval_specs():
        if spec.score_field is None:
            continue
        _attach_best(
            trainer,
            spec,
            score_name=cfg.get(spec.score_field, None),
            score_factor=cfg.get(spec.score_factor_field, 1),
            prefix=spec.ckpt_prefix,
            to_save=to_save,
            last_write=last_write,
        )
    if to_save is not None:
        trainer_engine = trainer.engines["trainer"]
        trainer._latest = Checkpoint(
            to_save,
            _saver(cfg, last_write),
            n_saved=cfg.n_saved,
            global_step_transform=global_step_from_engine(trainer_engine),
            filename_prefix=LATEST_PREFIX,
        )
        # Mid-epoch checkpoints (save_every_iters, preemption), named by the trainer iteration.
        trainer._latest_iter = Checkpoint(
            to_save,
            _saver(cfg, last_write),
            n_saved=cfg.n_saved,
            global_step_transform=lambda _engine, _event: trainer_engine.state.iteration,
            filename_prefix=LATEST_ITER_PREFIX,
        )


def _attach_best(trainer, spec, score_name, score_factor, prefix, to_save, last_write) -> None:
    if trainer.engines.get(spec.key) is None or not score_name:
        return
    cfg = trainer.cfg
    trainer_engine = trainer.engines["trainer"]
    best = None
    if to_save is not None:
        best = Checkpoint(
            to_save,
            _saver(cfg, last_write),
            n_saved=cfg.n_saved,
            filename_prefix=best_prefix_for(prefix),
            score_function=score_function(score_name, score_factor),
            score_name=None,
            global_step_transform=global_step_from_engine(trainer_engine),
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


def load_checkpoints(trainer) -> bool:
    """Warm-start weights and/or resume a run; returns whether anything was loaded."""
    cfg = trainer.cfg
    loaded = False
    if cfg.model_checkpoint_dir:
        if not Path(cfg.model_checkpoint_dir).is_file():
            raise ConfigError(
                f"model_checkpoint_dir {cfg.model_checkpoint_dir!r} is not a file.\n"
                f"  Despite its name it takes a checkpoint FILE, e.g. "
                f"<save_dir>/latest_epoch_checkpoint_3.pt."
            )
        rank_zero_print(f"LOADING MODEL FROM: {cfg.model_checkpoint_dir}")
        load_weights(cfg.model_checkpoint_dir, trainer.model, strict=cfg.strict)
        loaded = True
    if cfg.resume:
        loaded = _resume_from_newest(trainer) or loaded
    return loaded


def _resume_from_newest(trainer) -> bool:
    """Resume from the newest checkpoint that loads; one that does not is skipped, loudly."""
    save_dir = trainer.cfg.save_dir
    candidates = find_resume_checkpoints(save_dir)
    for path in candidates:
        try:
            state = load_checkpoint_file(path)
        except (RuntimeError, EOFError, OSError) as error:
            warnings.warn(
                f"skipping {path}, which does not load ({error}); trying an older checkpoint.",
                stacklevel=3,
            )
            continue
        rank_zero_print(f"RESUMING FROM: {path}")
        _resume_from(trainer, state)
        return True
    what = "loadable " if candidates else ""
    warnings.warn(
        f"resume=True but {save_dir} has no {what}{LATEST_PREFIX}* or {LATEST_ITER_PREFIX}* "
        f"checkpoint, so the run starts from scratch.",
        stacklevel=3,
    )
    return False


def _resume_from(trainer, state) -> None:
    objects = _to_save(trainer)
    missing = sorted(key for key in objects if key not in state)
    if missing:
        warnings.warn(f"checkpoint has no state for {missing}; resuming without it.", stacklevel=3)
    present = {key: obj for key, obj in objects.items() if key in state}
    _warn_if_epoch_length_changed(trainer, state.get("trainer", {}))
    Checkpoint.load_objects(to_load=present, checkpoint=state)
    restored = objects["run_meta"].restored_max_epochs
    max_epochs = trainer.cfg.max_epochs
    if trainer.scheduler is not None and restored is not None and restored != max_epochs:
        warnings.warn(
            f"resuming a run made for max_epochs={restored} with max_epochs={max_epochs}: the "
            f"learning rate still follows the old {restored}-epoch schedule.\n"
            f"  Keep max_epochs={restored}, or start fresh from the weights with resume=False and "
            f"model_checkpoint_dir=<a latest_epoch checkpoint> and the new max_epochs.",
            stacklevel=3,
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


def load_eval_checkpoint(trainer):
    """Load the weights (and extra state) that ``gatle-ignite eval`` evaluates."""
    cfg = trainer.cfg
    which = cfg.get("load_from_ckpt", "best")
    ckpt = resolve_eval_checkpoint(cfg.save_dir, which, prefix="valid_")
    if ckpt is None:
        raise ConfigError(
            f"no {which!r} checkpoint found in {cfg.save_dir}\n"
            f"  Train first, or point save_dir at a run directory."
        )
    rank_zero_print(f"LOADING CHECKPOINT: {ckpt}")
    state = load_checkpoint_file(ckpt)
    Checkpoint.load_objects(to_load={"model": trainer.model}, checkpoint=state, strict=cfg.strict)
    for key, obj in trainer.extra_to_save().items():
        if key in state:
            Checkpoint.load_objects(to_load={key: obj}, checkpoint={key: state[key]})
        else:
            warnings.warn(
                f"{ckpt} has no '{key}'; evaluating with a freshly built '{key}'. This is "
                f"expected for checkpoints written before extra_to_save() returned it.",
                stacklevel=2,
            )
    return ckpt
