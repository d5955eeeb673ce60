"""The trial's side of a sweep: report each evaluation's score to the study, stop when pruned.

A run started by a sweep worker learns which trial it is from the environment
(``run.sweep_trial``), and its ``train`` command trains it through :func:`fit_as_trial`: the
trainer knows no sweep, the sweep attaches its report from outside. After each evaluation, and
after that evaluation's best checkpoint, rank 0 reports the score at the epoch and asks the
study's pruner whether the trial is clearly behind; under DDP the answer is broadcast, so every
rank stops at the same point. A pruned run ends after that epoch's checkpoint, in state
``pruned``.

A study database that does not answer is waited for (``sweep.reconnect``); one that does not
answer within the sweep's bound costs the trial its pruning, never its training: it trains on
without reporting, and its worker reports the scores from ``metrics.csv`` when it ends.
"""

import contextlib
import math
import threading
from typing import Optional

import ignite.distributed as idist
import torch

from gatle_ignite.run.sweep_trial import trial_of_this_process
from gatle_ignite.sweep.reconnect import StorageUnreachable
from gatle_ignite.sweep.study import build_pruner, open_storage, quiet_optuna, require_optuna
from gatle_ignite.utils.dist import rank_zero_print

__all__ = ["TrialReport", "attach_trial", "fit_as_trial"]


class TrialReport:
    """A post-evaluation handler: the score to the study, the pruner's decision to every rank."""

    def __init__(self, trial: dict, trainer):
        self.trial = trial
        self.metric = trial["metric"]
        self.pruned = False
        self.reason = ""
        # Set once the study's database did not answer within the sweep's bound.
        self.unreported = False
        self._trainer = trainer
        self._optuna_trial = None
        # Held while the study is opened, by the background opening or the first report.
        self._opening = threading.Lock()

    def open_in_background(self) -> None:
        """Import Optuna and open the study while the first epoch trains (rank 0), so the
        first report does not wait for them."""
        threading.Thread(target=self._open_quietly, daemon=True).start()

    def _open_quietly(self) -> None:
        # A failure here is raised again, where it belongs, by the first report.
        with contextlib.suppress(Exception):
            self._study_trial()

    def __call__(self, engine) -> None:
        trainer = self._trainer
        value = engine.state.metrics.get(self.metric)
        if trainer._diverged or self.pruned or value is None:
            return
        value = float(value)
        epoch = trainer.engines["trainer"].state.epoch
        prune = self._report_unless_unreachable(value, epoch) if idist.get_rank() == 0 else False
        if idist.get_world_size() > 1:
            flag = torch.tensor([int(prune)], device=idist.device())
            prune = bool(idist.broadcast(flag, src=0).item())
        if prune:
            self.pruned = True
            self.reason = f"after epoch {epoch}, {self.metric} {value:.5g}"
            # What run.json records as the way the run ended.
            trainer._stopped_from_outside = ("pruned", self.reason)
            rank_zero_print(
                f"PRUNED by the sweep after epoch {epoch}: {self.metric} {value:.5g} is behind "
                f"the other trials; this epoch's checkpoint is the run's last."
            )
            trainer.engines["trainer"].terminate()

    def _report_unless_unreachable(self, value: float, epoch: int) -> bool:
        if self.unreported:
            return False
        try:
            return self._report(value, epoch)
        except StorageUnreachable as error:
            self.unreported = True
            rank_zero_print(
                f"sweep: {error}: this trial trains on without reporting to it, and is not "
                f"pruned; its worker reports its scores from metrics.csv when it ends."
            )
            return False

    def _report(self, value: float, epoch: int) -> bool:
        """Report the score at ``epoch`` (once: a resumed trial may evaluate an epoch again)
        and ask the pruner; rank 0 only."""
        if not math.isfinite(value):
            return False
        trial = self._study_trial()
        with quiet_optuna():
            trial.report(value, epoch)
            return self.trial.get("pruner", "none") != "none" and trial.should_prune()

    def _study_trial(self):
        with self._opening:
            if self._optuna_trial is None:
                self._optuna_trial = self._opened()
            return self._optuna_trial

    def _opened(self):
        optuna = require_optuna()
        storage = open_storage(self.trial["storage"], self._retry_s(), retry_opening=True)
        study = optuna.load_study(
            study_name=self.trial["study"],
            storage=storage,
            # Only the worker samples; this process never draws a parameter.
            sampler=optuna.samplers.RandomSampler(),
            pruner=build_pruner(self.trial.get("pruner", "none"), self.trial.get("pruner_params")),
        )
        return optuna.trial.Trial(study, self.trial["trial_id"])

    def _retry_s(self) -> Optional[float]:
        """The sweep's retry bound; under DDP within half of dist_timeout, which the other
        ranks wait at most for this report's broadcast."""
        retry_s = self.trial.get("storage_retry")
        dist_timeout = self._trainer.cfg.get("dist_timeout", None)
        if retry_s is not None and dist_timeout and idist.get_world_size() > 1:
            return min(retry_s, dist_timeout / 2)
        return retry_s


def attach_trial(trainer) -> Optional[TrialReport]:
    """Attach the report after every evaluation when this run is a sweep's trial."""
    trial = trial_of_this_process()
    if trial is None or "run" in trainer.cfg:
        return None
    report = TrialReport(trial, trainer)
    for spec in trainer.eval_specs():
        if trainer.engines.get(spec.key) is not None:
            trainer._post_eval.setdefault(spec.key, []).append(report)
    if idist.get_rank() == 0:
        report.open_in_background()
    return report


def fit_as_trial(task):
    """Train ``task`` as this process's sweep trial: ``fit()``, with the report attached after
    the task's own handlers (its ``attach_runner``, overrides included). A job for
    ``run_task``, so every rank does it."""
    attach_runner = task.attach_runner

    def attach_runner_then_report():
        attach_runner()
        attach_trial(task)

    task.attach_runner = attach_runner_then_report
    return task.fit()
