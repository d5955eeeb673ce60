"""``gatle-ignite lr-find``: a learning-rate range test with the trainer's own step and optimizer.

ignite's ``FastaiLRFinder`` raises the learning rate exponentially, one training batch at a
time, and records the (smoothed) loss; it restores the model and the optimizer afterwards. The
trainer is built in inference mode, so no run directory is opened and no checkpoint is written.
"""

import math
import os
import warnings
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Optional, Union

from gatle_ignite.dispatch import ConfigError, import_entrypoint

if TYPE_CHECKING:
    # Only for the annotations: the parser reads this module's defaults, and must stay light.
    from ml_collections import config_dict

__all__ = ["LRSearch", "curve_story", "draw_lr_search", "find_lr", "run_lr_find"]

DEFAULT_START_LR = 1e-7
DEFAULT_END_LR = 10.0
DEFAULT_NUM_ITER = 100
PLOT_FILE = "lr_find.png"
# ignite's FastaiLRFinder stops once the smoothed loss passes this many times its lowest.
_DIVERGED = 5
# A last loss this much above the lowest is told as a rise, not noise around the minimum.
_ROSE = 1.1


class LRSearch(NamedTuple):
    lrs: list
    losses: list
    suggestion: float
    # Whether the loss blew up before the last iteration, which ended the search there.
    diverged: bool


def run_lr_find(
    cfg: "config_dict.ConfigDict",
    out: Optional[Union[str, os.PathLike]] = None,
    start_lr: float = DEFAULT_START_LR,
    end_lr: float = DEFAULT_END_LR,
    num_iter: int = DEFAULT_NUM_ITER,
) -> LRSearch:
    """Search, draw the curve to ``out`` (default ``<save_dir>/lr_find.png``), print the advice."""
    from gatle_ignite.cli.plot import require_matplotlib

    _check_range(start_lr, end_lr, num_iter)
    # Before the search, which can take a while, rather than after it.
    require_matplotlib("lr-find")
    search = find_lr(_built_trainer(cfg), start_lr, end_lr, num_iter)
    out = Path(out) if out else Path(cfg.save_dir) / PLOT_FILE
    draw_lr_search(search, out)
    _report(search, cfg, out)
    return search


def _built_trainer(cfg):
    """The config's trainer in inference mode, from the weights training would start from."""
    from gatle_ignite.run.loading import load_weights

    cfg.run = True
    Trainer = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    trainer = Trainer(0, cfg).setup()
    if cfg.get("model_checkpoint_dir", None):
        # A fine-tune's learning rate is the one that suits the weights it starts from.
        load_weights(cfg.model_checkpoint_dir, trainer.model, strict=cfg.strict)
    return trainer


def _check_range(start_lr: float, end_lr: float, num_iter: int) -> None:
    if not 0 < start_lr < end_lr:
        raise ConfigError(
            f"lr-find needs 0 < --start-lr < --end-lr, got {start_lr:g} and {end_lr:g}"
        )
    if num_iter < 3:
        raise ConfigError(f"lr-find needs --num-iter >= 3 to find a slope, got {num_iter}")


def find_lr(trainer, start_lr: float, end_lr: float, num_iter: int) -> LRSearch:
    """Run the range test on ``trainer`` (set up); its model and optimizer are restored."""
    from ignite.engine import Engine, Events
    from ignite.handlers import FastaiLRFinder

    spec = trainer.train_spec()
    if not spec.total_loss:
        raise ConfigError(
            f"lr-find follows the total training loss, and {type(trainer).__name__}'s "
            f"train_spec() has none (total_loss=False): there is no single loss to minimise."
        )
    # A fresh engine: the trainer's own carries the config's LR schedule, which would fight
    # the finder's, and its checkpoint and logging handlers.
    engine = Engine(partial(getattr(trainer, spec.step), split=spec.engine_type))
    engine.add_event_handler(Events.ITERATION_COMPLETED, _stop_at_non_finite_loss)
    to_save = {"model": trainer.model, "optimizer": trainer.optimizer}
    if trainer.scaler is not None:
        to_save["scaler"] = trainer.scaler
    finder = FastaiLRFinder()
    with (
        warnings.catch_warnings(),
        finder.attach(
            engine,
            to_save=to_save,
            output_transform=_total_loss,
            num_iter=num_iter,
            start_lr=float(start_lr),
            end_lr=float(end_lr),
            diverge_th=_DIVERGED,
        ) as searching,
    ):
        # ignite's advice on a run that never diverged speaks of its API; _report says it.
        warnings.filterwarnings("ignore", message="Run completed without loss diverging")
        searching.run(trainer.dls["train"])
    history = finder.get_results()
    diverged = len(history["loss"]) < num_iter
    _drop_non_finite_tail(history)
    scheduled = [_first_group(lr) for lr in history["lr"]]
    # ignite records, beside each loss, the rate its schedule sets for the NEXT step: the step
    # that made the loss ran at the one before (the first at start_lr).
    used = [float(start_lr), *scheduled[:-1]]
    suggestion = _suggestion(finder)
    return LRSearch(
        lrs=used,
        losses=list(history["loss"]),
        suggestion=used[scheduled.index(suggestion)] if suggestion in scheduled else suggestion,
        diverged=diverged,
    )


def _total_loss(output):
    try:
        return output["losses"]["loss"]
    except (KeyError, TypeError) as error:
        raise ConfigError(
            "lr-find reads the train step's total loss, output['losses']['loss'], and this "
            "train step returns none."
        ) from error


def _stop_at_non_finite_loss(engine) -> None:
    if not math.isfinite(float(_total_loss(engine.state.output).detach())):
        engine.terminate()


def _drop_non_finite_tail(history: dict) -> None:
    """Forget the non-finite losses that ended the search, so the suggestion can be computed."""
    while history["loss"] and not math.isfinite(history["loss"][-1]):
        history["loss"].pop()
        history["lr"].pop()


def _first_group(lr):
    # Every parameter group is swept from the same start_lr, so the first speaks for all.
    return lr[0] if isinstance(lr, list) else lr


def _suggestion(finder) -> float:
    try:
        return _first_group(finder.lr_suggestion())
    except RuntimeError as error:
        raise ConfigError(
            f"lr-find could not suggest a learning rate: {error}\n"
            f"  Widen the range (--start-lr lower, --end-lr higher) or raise --num-iter."
        ) from error


def draw_lr_search(search: LRSearch, out: Union[str, os.PathLike]):
    """Draw the loss against the learning rate (log scale) to ``out``; returns the Figure."""
    # Here, not at the top: `gatle-ignite` reads this module's defaults to build its parser.
    from gatle_ignite.cli.plot import require_matplotlib, save_png

    Figure = require_matplotlib("lr-find")
    figure = Figure(figsize=(6, 4))
    ax = figure.subplots()
    ax.plot(search.lrs, search.losses, linewidth=1.4, label="loss (smoothed)")
    ax.axvline(
        search.suggestion, color="C3", linestyle="--", label=f"suggested lr {search.suggestion:.3g}"
    )
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    figure.tight_layout()
    save_png(figure, out)
    return figure


def curve_story(search: LRSearch) -> str:
    """What the (smoothed) loss did over the search, in words, with the rates where it did it."""
    losses, lrs = search.losses, search.lrs
    low = min(range(len(losses)), key=losses.__getitem__)
    first, lowest, last = losses[0], losses[low], losses[-1]
    if low == 0:
        story = f"the loss never fell below its first value {first:.3g}, and rose to {last:.3g}"
        return story + ": a lower --start-lr shows where it falls"
    if low == len(losses) - 1:
        return (
            f"the loss fell from {first:.3g} to {lowest:.3g} and was still falling at the last "
            f"lr, {lrs[-1]:.3g}: a higher --end-lr shows where it rises"
        )
    story = f"the loss fell from {first:.3g} to {lowest:.3g} at lr {lrs[low]:.3g}"
    if search.diverged:
        return story + (
            f", then blew up by lr {lrs[-1]:.3g} (past {_DIVERGED:g} times its lowest, or not "
            f"finite), which ended the search"
        )
    if last > lowest * _ROSE:
        return story + f", then rose to {last:.3g} at lr {lrs[-1]:.3g}"
    return story + (
        f" and stayed near it ({last:.3g}) to the last lr, {lrs[-1]:.3g}: a higher --end-lr "
        f"shows where it rises"
    )


def _report(search: LRSearch, cfg, out: Path) -> None:
    print(
        f"LR FIND: {len(search.lrs)} iterations, lr {search.lrs[0]:.3g} to "
        f"{search.lrs[-1]:.3g}: {curve_story(search)}"
    )
    print(f"suggested learning rate: {search.suggestion:.3g}")
    if "lr" in cfg.get("optimizer_params", {}):
        print(f"  train with it: --override optimizer_params.lr={search.suggestion:.3g}")
    print(f"loss-vs-lr plot written to {out}")
