"""``gatle-ignite config --dry-run``: one batch of every split through the whole chain.

Each split's first batch goes through ``prep_batch``, the model, the loss (train split) and
the metrics, and the shapes are printed; the score fields are checked against the metrics
computed. The trainer is built in inference mode and nothing
is written: a failure names the stage it happened in, as a config error.
"""

import contextlib
import copy
import logging
from typing import Optional

import torch
from ml_collections import config_dict

from gatle_ignite.dispatch import ConfigError, import_entrypoint
from gatle_ignite.specs import EngineSpec
from gatle_ignite.trainer.checks import check_scores
from gatle_ignite.utils.batch import named_outputs
from gatle_ignite.utils.frames import where_raised

__all__ = ["describe", "dry_run"]


def dry_run(cfg: config_dict.ConfigDict) -> None:
    """Run one batch of every split with data through the chain, printing what it produces."""
    from gatle_ignite.trainer.base import BaseTrainer

    cfg = copy.deepcopy(cfg)
    # Inference mode: no run directory is opened, so no lock, run.json or checkpoint.
    cfg.run = True
    with _stage("setup"):
        Trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
        trainer = Trainer(0, cfg).setup()
    # engine key -> the metric names attached to it, for the engines training runs.
    produced = {}
    for spec in (trainer.train_spec(), *trainer.eval_specs()):
        loader = trainer.dls.get(spec.split)
        print()
        if loader is None:
            print(f"[{_where_run(spec)}] no data ({spec.split}_ds_name is not set): skipped")
            continue
        print(f"[{_where_run(spec)}] one batch")
        with _stage("data", spec):
            batch = next(iter(loader))
        if getattr(type(trainer), spec.step) is getattr(BaseTrainer, spec.step, None):
            output = _default_step(trainer, spec, batch)
        else:
            output = _own_step(trainer, spec, batch)
        names = _run_metrics(trainer, spec, output)
        if spec.every_field is None or spec.cadence(cfg) > 0:
            produced[spec.key] = names
    if type(trainer).attach_metrics is BaseTrainer.attach_metrics:
        with _stage("the score check"):
            # What fit() checks before it trains, against the metrics just attached.
            check_scores(cfg, trainer.eval_specs(), produced)
    print()
    print("dry run: every split went through the chain.")


def _where_run(spec: EngineSpec) -> str:
    """``valid split``; an engine sharing another's split (an EMA's raw weights) is named too."""
    if spec.engine_type == spec.split:
        return f"{spec.split} split"
    return f"{spec.engine_type} engine, {spec.split} split"


@contextlib.contextmanager
def _stage(stage: str, spec: Optional[EngineSpec] = None):
    """Turn any failure inside into a config error that names the stage (and the engine)."""
    try:
        yield
    except Exception as error:
        where = f" ({_where_run(spec)})" if spec else ""
        what = str(error) if isinstance(error, ConfigError) else f"{type(error).__name__}: {error}"
        # A note the trainer added (the config that built a library's model) says the fix.
        notes = "".join(f"\n  {note}" for note in getattr(error, "__notes__", ()))
        lines = where_raised(error, library_line=not notes)
        raise ConfigError(f"dry run failed at {stage}{where}: {what}{lines}{notes}") from None


def _autocast(trainer):
    return torch.autocast(
        device_type=trainer.device_type, dtype=trainer.dtype, enabled=trainer.autocast_enabled
    )


def _default_step(trainer, spec, batch) -> dict:
    """The default steps' chain, stage by stage, without a backward pass or optimizer step."""
    trainer.model.train(spec.with_losses)
    with _stage("prep_batch", spec):
        x = trainer.prep_batch(batch, split=spec.engine_type)
        model_input = x["model_input"]
    print(f"  model_input: {describe(model_input)}")
    with _stage("forward", spec), torch.no_grad(), _autocast(trainer):
        y_pred = trainer._forward_explained(model_input)
    print(f"  output:      {describe(y_pred)}")
    output = {"y_pred": y_pred, "target": x}
    if spec.with_losses:
        with _stage("loss", spec), torch.no_grad(), _autocast(trainer):
            loss, parts = trainer.loss_fn(y_pred, x, iteration=1)
            # Training backpropagates it, so it must be one number.
            value = loss.item()
        output["losses"] = {"loss": loss, **parts}
        print(f"  losses:      {describe(output['losses'])}")
        print(f"  loss:        {value:.6g}")
    return output


def _own_step(trainer, spec, batch) -> dict:
    """A task's own step runs whole: its stages are its own."""
    from ignite.engine import Engine

    engine = Engine(lambda _engine, _batch: None)
    engine.state.iteration, engine.state.epoch, engine.state.epoch_length = 1, 1, 1
    with _stage(spec.step, spec):
        output = getattr(trainer, spec.step)(engine, batch, split=spec.engine_type)
    print(f"  {spec.step} (the task's own) output: {describe(output.get('y_pred'))}")
    if "losses" in output:
        print(f"  losses:      {describe(output['losses'])}")
    return output


def _run_metrics(trainer, spec, output: dict) -> Optional[list]:
    """Attach the split's metrics to a one-iteration engine that yields ``output``; returns
    the names attached."""
    from ignite.engine import Engine

    engine = Engine(lambda _engine, _batch: output)
    # The stage's config error reports a failure; ignite's own logger would announce it twice.
    engine.logger = logging.getLogger(f"{__name__}.metrics")
    engine.logger.setLevel(logging.CRITICAL)
    with _stage("metric", spec):
        attached = trainer.init_metrics(
            engine,
            spec.engine_type,
            trainer.cfg.get(spec.metrics_field, {}),
            info=trainer.infos.get(spec.split),
            with_losses=spec.with_losses,
            total_loss=spec.total_loss,
        )
        engine.run([None], max_epochs=1)
    for name, value in engine.state.metrics.items():
        print(f"  {name}: {describe(value)}")
    # An override of init_metrics may return nothing; training then checks no score either.
    return list(attached) if hasattr(attached, "keys") else None


def describe(value) -> str:
    """Shapes for tensors (``float32[16, 8]``), recursively through dicts, dataclasses, lists and
    tuples."""
    if torch.is_tensor(value):
        if value.dim() == 0 and value.is_floating_point():
            return f"{str(value.dtype).replace('torch.', '')}[] = {float(value):.6g}"
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    named = named_outputs(value)
    if named is not None:
        return "{" + ", ".join(f"{key}: {describe(item)}" for key, item in named.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe(item) for item in value) + "]"
    if isinstance(value, float):
        return f"{value:.6g}"
    return type(value).__name__
