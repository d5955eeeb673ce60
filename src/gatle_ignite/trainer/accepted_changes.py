"""Accepted config changes on resume: made to take effect on what the checkpoint restored.

Loading a checkpoint puts back the optimizer's hyperparameters and the schedule's values as
they were, so an accepted ``optimizer_params.lr`` would otherwise be silently ignored. Before
the load, the freshly built optimizer and schedules (from the new config) are noted; after it,
the accepted hyperparameters are copied back, and each schedule the trainer drives is rebuilt
as the new config makes it and replayed to the run's position. The rebuilt schedule keeps the
run length the checkpoint's was built for unless ``max_epochs`` itself is accepted: a raised
``max_epochs`` refits the schedule only when it is named.
"""

import copy
import warnings
from typing import Optional

from ignite.engine import Events

from gatle_ignite.schedulers import prep_scheduler

__all__ = ["apply_accepted_changes", "fresh_settings", "schedule_epochs"]

_ITERATION_EVENTS = (Events.ITERATION_STARTED, Events.ITERATION_COMPLETED)


def schedule_epochs(state, accepted) -> Optional[int]:
    """The max_epochs a rebuilt schedule is built for: the checkpoint's, unless ``max_epochs``
    is accepted (then None: this config's)."""
    if "max_epochs" in accepted:
        return None
    meta = state.get("run_meta") if hasattr(state, "get") else None
    length = meta.get("max_epochs") if isinstance(meta, dict) else None
    return length if isinstance(length, int) else None


def fresh_settings(trainer, to_load: dict, epochs: Optional[int] = None) -> dict:
    """What the new config built, before a checkpoint overwrites it.

    ``replayed`` names the schedules of ``to_load`` that are rebuilt rather than loaded; the
    caller leaves them out of the load. ``epochs``: the run length to build them for, when it
    is not this config's ``max_epochs``.
    """
    groups = getattr(trainer.optimizer, "param_groups", [])
    noted = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in groups]
    if _schedule_event(trainer) is None:
        return {"groups": noted, "replayed": {}}
    schedules = {k: v for k, v in to_load.items() if k.split("_")[0] == "scheduler"}
    states = {k: copy.deepcopy(s.state_dict()) for k, s in schedules.items()}
    if epochs not in (None, trainer.cfg.max_epochs):
        states.update(_built_for(trainer, epochs, list(schedules)))
    return {"groups": noted, "replayed": {k: (s, states[k]) for k, s in schedules.items()}}


def _built_for(trainer, epochs: int, keys: list) -> dict:
    """The states of the trainer's schedules as this config builds them for ``epochs``
    epochs, by ``to_load`` key. Building one touches the optimizer's lr, which the checkpoint
    load that follows puts back."""
    cfg = copy.deepcopy(trainer.cfg)
    cfg.max_epochs = epochs
    built, _engine, _event = prep_scheduler(
        cfg.lr_scheduler, cfg, trainer.dls["train"], trainer.optimizer, trainer.engines
    )
    built = built if isinstance(built, (list, tuple)) else [built]
    stateful = [s for s in built if hasattr(s, "state_dict")]
    if len(stateful) != len(keys):
        return {}
    return {key: copy.deepcopy(s.state_dict()) for key, s in zip(keys, stateful)}


def apply_accepted_changes(trainer, fresh: dict, accepted) -> None:
    _restore_hyperparameters(trainer.optimizer, fresh["groups"], accepted)
    seen = _events_seen(trainer)
    for scheduler, state in fresh["replayed"].values():
        scheduler.load_state_dict(state)
        for _ in range(seen):
            scheduler(None)
    if trainer.scheduler is not None and not fresh["replayed"]:
        warnings.warn(
            "the learning-rate schedule follows an event the trainer cannot replay (an "
            "evaluator's, or a filtered one), so it keeps its restored state; the accepted "
            "optimizer values apply from here on.",
            stacklevel=3,
        )


def _accepted_keys(accepted, groups) -> set:
    keys = set()
    for name in accepted:
        if name == "optimizer_params":
            keys.update(k for g in groups for k in g)
        elif name.startswith("optimizer_params."):
            keys.add(name.split(".")[1])
    return keys


def _restore_hyperparameters(optimizer, groups, accepted) -> None:
    keys = _accepted_keys(accepted, groups)
    for group, fresh in zip(getattr(optimizer, "param_groups", []), groups):
        for key in keys & set(fresh):
            group[key] = fresh[key]


def _schedule_event(trainer):
    """The trainer event the schedule follows, or None for anything a replay cannot count
    (an evaluator's event, a filtered one, a build_scheduler override)."""
    engine_name, event = getattr(trainer, "_scheduler_event", (None, None))
    if engine_name != "trainer" or getattr(event, "filter", None) is not None:
        return None
    known = (*_ITERATION_EVENTS, Events.EPOCH_STARTED, Events.EPOCH_COMPLETED)
    return event if event in known else None


def _events_seen(trainer) -> int:
    """How many times the trainer fired the schedule's event before the checkpoint."""
    event = _schedule_event(trainer)
    state = trainer.engines["trainer"].state
    if event in _ITERATION_EVENTS:
        return state.iteration
    if event == Events.EPOCH_STARTED:
        # A loaded state counts completed epochs; the one in progress had started too.
        return state.epoch + int(bool(state.epoch_length) and state.iteration % state.epoch_length)
    return state.epoch
