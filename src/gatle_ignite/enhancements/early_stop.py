"""Early stopping on an eval engine's score, decided identically on every rank."""

import ignite.distributed as idist
from ignite.handlers import EarlyStopping

from gatle_ignite.dispatch import ConfigError

__all__ = ["EarlyStop", "build_early_stoppers", "early_stop_settings", "unbuilt_engine_error"]

# The state keys ignite has always written; newer keys are filled in when an old state lacks them.
_CARRIED = ("counter", "best_score")


def early_stop_settings(spec, cfg):
    """``(patience, after)`` for this spec, or None when it never stops the run."""
    if spec.early_stop_patience_field is None or spec.score_field is None:
        return None
    patience = cfg.get(spec.early_stop_patience_field, 0) or 0
    if patience <= 0:
        return None
    if not cfg.get(spec.score_field, None):
        raise ConfigError(
            f"cfg.{spec.early_stop_patience_field} = {patience} but cfg.{spec.score_field} is "
            f"unset, so there is no metric to stop on.\n"
            f"  Set cfg.{spec.score_field} (e.g. '{spec.engine_type}/acc'), or set the patience "
            f"to 0."
        )
    after = 0
    if spec.early_stop_after_field:
        after = cfg.get(spec.early_stop_after_field, 0) or 0
    return int(patience), int(after)


def unbuilt_engine_error(spec, cfg) -> ConfigError:
    """The error for a patience set on an engine this config never builds."""
    every = cfg.get(spec.every_field, None) if spec.every_field else None
    return ConfigError(
        f"cfg.{spec.early_stop_patience_field} asks to stop on the '{spec.engine_type}' "
        f"engine, which this config never builds (cfg.{spec.every_field} = {every!r}, or "
        f"no dataloader).\n"
        f"  Give it a dataset and a cadence >= 1, or set the patience to 0."
    )


def build_early_stoppers(specs, engines, cfg, score_function) -> dict:
    built = {}
    for spec in specs:
        settings = early_stop_settings(spec, cfg)
        if settings is None:
            continue
        if engines.get(spec.key) is None:
            raise unbuilt_engine_error(spec, cfg)
        patience, after = settings
        built[f"early_stop_{spec.engine_type}"] = EarlyStop(
            spec=spec,
            patience=patience,
            after=after,
            score_function=score_function(
                cfg.get(spec.score_field), cfg.get(spec.score_factor_field, 1)
            ),
            trainer=engines["trainer"],
        )
    return built


class EarlyStop:
    """A post-eval handler around ignite's EarlyStopping, with its counter checkpointed.

    Only a strictly better score is an improvement (a tie counts against the patience), while
    the best checkpoint, by 0.4's rule, moves to the newest of tied epochs. The decision is
    taken after the evaluation; its line is printed by ``announce``, after the epoch's block of
    metrics.
    """

    def __init__(self, spec, patience, after, score_function, trainer):
        self.spec = spec
        self.patience = patience
        self.after = after
        self.score_function = score_function
        self.trainer = trainer
        self._inner = EarlyStopping(
            patience=patience, score_function=self._agreed_score, trainer=trainer
        )
        # What the last evaluation decided, for announce(); None when there is nothing to say.
        self._pending = None

    def _agreed_score(self, engine) -> float:
        """Rank 0's score, broadcast so every rank's counter moves together."""
        value = 0.0
        try:
            if idist.get_rank() == 0:
                value = float(self.score_function(engine))
        finally:
            if idist.get_world_size() > 1:
                value = float(idist.broadcast(value, src=0))
        return value

    def __call__(self, engine):
        epoch = self.trainer.state.epoch
        if epoch < self.after:
            return
        before = self._inner.counter
        self._inner(engine)
        counter = self._inner.counter
        if counter >= self.patience or counter > before:
            self._pending = (counter, epoch)

    def announce(self, _engine=None) -> None:
        """Print what the last evaluation decided (rank 0), once; attached after the epoch's
        metrics are logged, so the line sits under the block it judges."""
        pending, self._pending = self._pending, None
        if pending is None or idist.get_rank() != 0:
            return
        counter, epoch = pending
        name = self.spec.engine_type
        if counter >= self.patience:
            print(
                f"[early-stop] {name}: no improvement for {counter} evaluations -- "
                f"stopping at epoch {epoch}"
            )
        else:
            print(f"[early-stop] {name}: {counter}/{self.patience} evaluations with no improvement")

    @property
    def stopped(self) -> bool:
        """Whether it has run out of patience, so the run ended here."""
        return self._inner.counter >= self.patience

    def reason(self) -> str:
        return (
            f"no improvement of {self.spec.engine_type} score for {self._inner.counter} evaluations"
        )

    def state_dict(self) -> dict:
        return dict(self._inner.state_dict())

    def load_state_dict(self, state_dict) -> None:
        state = dict(state_dict)
        live = self._inner.state_dict()
        for key in getattr(EarlyStopping, "_state_dict_all_req_keys", ()):
            if key not in state and key not in _CARRIED:
                state[key] = live[key]
        self._inner.load_state_dict(state)
