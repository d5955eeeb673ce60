"""check_every: the loop reads the losses from the device only at check points, yet a
non-finite loss is still named at its own iteration and nothing after it is saved."""

import csv
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from ignite.engine import Events

from gatle_ignite.trainer.lifecycle import EXIT_DIVERGED
from gatle_ignite.trainer.preemption import EXIT_PREEMPTED, Preempted
from tests.conftest import HANG_S, ROOT, child_env
from tests.toy.config_file import write_toy_config
from tests.toy.trainer import Trainer

NAN_FROM_6 = {
    "cls_name": "tests.toy.nan_loss",
    "weight": 1.0,
    "start_iteration": 6,
}


def _nan_cfg(make_cfg, every, **fields):
    # 4 iterations per epoch; the loss is NaN from iteration 6, in epoch 2.
    cfg = make_cfg(
        max_epochs=5,
        check_every=every,
        train_ds_params={"n": 64, "bs": 16},
        logger_name=["csv"],
        log_every=4,
        **fields,
    )
    cfg.criterion_params.dict_of_loss_params["bad"] = dict(NAN_FROM_6)
    return cfg


def _checkpoints(cfg):
    return sorted(p.name for p in Path(cfg.save_dir).glob("*.pt"))


def _logged_steps(cfg):
    with open(Path(cfg.save_dir) / "metrics.csv", newline="") as handle:
        return [row for row in csv.DictReader(handle)]


@pytest.mark.parametrize("every", [1, 8])
def test_a_nan_is_named_at_its_iteration_and_nothing_after_it_is_kept(make_cfg, every):
    cfg = _nan_cfg(make_cfg, every)
    task = Trainer(0, cfg)
    with pytest.warns(UserWarning, match="not finite at iteration 6"):
        task.fit()
    state = task.engines["trainer"].state
    assert state.iteration == (6 if every == 1 else 8)
    assert task._nan_check.first_bad == 6
    assert _checkpoints(cfg) == ["latest_epoch_checkpoint_1.pt", _best_of_epoch_1(cfg)]
    # The evaluator ran for epoch 1 only; nothing of epoch 2 was logged.
    assert task.engines["evaluator"].state.epoch == 1
    rows = _logged_steps(cfg)
    assert rows and all(row["epoch"] in ("", "1") for row in rows if row["name"] != "train/lr_0")
    assert all(int(row["step"]) <= 5 for row in rows if row["step"])


def _best_of_epoch_1(cfg):
    return next(n for n in _checkpoints(cfg) if n.startswith("valid_best_result_checkpoint_1_"))


def test_a_checkpoint_due_forces_a_check_so_the_run_stops_at_the_bad_step(make_cfg):
    cfg = _nan_cfg(make_cfg, 8, save_every_iters=1)
    task = Trainer(0, cfg)
    with pytest.warns(UserWarning, match="not finite at iteration 6"):
        task.fit()
    assert task.engines["trainer"].state.iteration == 6
    assert "latest_iter_checkpoint_5.pt" in _checkpoints(cfg)
    assert not any(n.startswith("latest_iter_checkpoint_6") for n in _checkpoints(cfg))


class SignalledAt(Trainer):
    def __init__(self, local_rank, cfg, at):
        super().__init__(local_rank, cfg)
        self.at = at

    def prep_batch(self, batch, split="train", **kwargs):
        if split == "train" and self.engines["trainer"].state.iteration == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().prep_batch(batch, split=split, **kwargs)


@pytest.mark.parametrize("every", [1, 8])
def test_preemption_saves_and_exits_75_within_check_every(make_cfg, every):
    cfg = make_cfg(max_epochs=3, check_every=every)
    task = SignalledAt(0, cfg, at=6)
    with pytest.raises(Preempted) as raised:
        task.fit()
    assert raised.value.code == EXIT_PREEMPTED
    stopped = task.engines["trainer"].state.iteration
    assert 6 <= stopped <= 6 + every
    assert f"latest_iter_checkpoint_{stopped}.pt" in _checkpoints(cfg)


# ---- host reads per iteration ----

_READS = ("item", "tolist", "__bool__", "__float__", "cpu")
_EXCLUDED = ("torch/optim/", "torch/utils/data/")


class ReadCounter:
    """Counts device->host reads made outside torch.optim and torch.utils.data."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in _READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original):
        counter = self

        def read(tensor, *args, **kwargs):
            frame = sys._getframe(1)
            if not any(part in frame.f_code.co_filename for part in _EXCLUDED):
                counter.count += 1
            return original(tensor, *args, **kwargs)

        return read


class CountingReads(Trainer):
    """Counts reads made between an iteration's start and the end of its last handler."""

    def attach_progress(self):
        super().attach_progress()
        trainer = self.engines["trainer"]
        self.reads_in_iterations = 0
        self.iterations = 0

        def start(engine):
            self._at_start = self.counter.count

        def end(engine):
            self.reads_in_iterations += self.counter.count - self._at_start
            self.iterations += 1

        trainer.add_event_handler(Events.ITERATION_STARTED, start)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, end)


@pytest.mark.parametrize("every", [1, 4, 8])
def test_host_reads_per_iteration_are_at_most_one_per_check(make_cfg, monkeypatch, every):
    cfg = make_cfg(
        max_epochs=2,
        check_every=every,
        train_ds_params={"n": 256, "bs": 16, "shuffle": True},
        logger_name=["text"],
        log_every=1000,
    )
    task = CountingReads(0, cfg)
    task.counter = ReadCounter(monkeypatch)
    task.fit()
    per_iteration = task.reads_in_iterations / task.iterations
    assert task.iterations == 32
    # k=1 is the negative control: one read on every step, which the counter must see.
    assert per_iteration == pytest.approx(1 / every)


class CountingAllReads(Trainer):
    """Counts every read of the run, from its first iteration to its end."""

    def attach_progress(self):
        super().attach_progress()
        self.counter.count = 0


def _loss_points(cfg):
    return [(r["step"], r["value"]) for r in _logged_steps(cfg) if r["name"] == "train/loss"]


def test_logged_points_cost_no_read_of_their_own(make_cfg, monkeypatch, tmp_path):
    # 10 epochs of 32 iterations; log_every unset, so a point every epoch_length // 20 = 1
    # iteration. The points' losses are read at the check points, every 16 iterations.
    fields = dict(max_epochs=10, train_ds_params={"n": 512, "bs": 16, "shuffle": True})
    fields.update(logger_name=["csv"], every_val=0, save_ckpt=False, score_name=None)
    task = CountingAllReads(0, make_cfg(check_every=16, **fields))
    task.counter = ReadCounter(monkeypatch)
    task.fit()
    iterations = task.engines["trainer"].state.iteration
    assert iterations == 320
    assert task.counter.count / iterations <= 0.2
    # Every point is still logged, with the loss of its own iteration: what a run reading
    # every step logs.
    every_step = make_cfg(check_every=1, **{**fields, "save_dir": str(tmp_path / "k1")})
    Trainer(0, every_step).fit()
    points = _loss_points(task.cfg)
    assert len(points) == 320
    assert points == _loss_points(every_step)


def test_check_every_defaults_to_every_step_for_one_cpu_process(make_cfg):
    task = Trainer(0, make_cfg(max_epochs=1))
    task.fit()
    assert task._nan_check.every == 1


def test_a_check_every_below_one_is_a_config_error(make_cfg):
    from gatle_ignite import ConfigError

    with pytest.raises(ConfigError, match="check_every"):
        Trainer(0, make_cfg(check_every=0))


def test_the_progress_loss_is_the_last_checked_value(make_cfg):
    task = Trainer(0, make_cfg(max_epochs=1, check_every=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task.fit()
    iteration, value = task._nan_check.last_loss
    assert iteration == 4 and isinstance(value, float)


# ---- two ranks: agreement at check points only ----

GLOO = ["--override=dist_backend='gloo'", "--override=auto_model_params.sync_bn=False"]


def _two_ranks(tmp_path, **fields):
    """Train the toy task on 2 gloo ranks with check_every=8 and 16 iterations per epoch."""
    fields = {
        "main_runner": "tests.toy.dist_trainer",
        "save_dir": str(tmp_path / "run"),
        "max_epochs": 2,
        "check_every": 8,
        "train_ds_params": {"n": 256, "bs": 16, "shuffle": True},
        **fields,
    }
    config = write_toy_config(tmp_path / "cfg.py", **fields)
    return subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"]
        + ["--override=nproc_per_node=2", *GLOO],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=child_env(),
    )


def _probe_iterations(save_dir):
    return [json.loads((save_dir / f"probe_rank{r}.json").read_text())["iteration"] for r in (0, 1)]


@pytest.mark.slow
def test_a_nan_on_one_rank_and_a_sigterm_on_the_other_stop_both_at_the_check(tmp_path):
    done = _two_ranks(
        tmp_path, fault_nan_rank=1, fault_nan_from=6, fault_sigterm_rank=0, fault_sigterm_at=7
    )
    # A diverged run's own exit code, not the preemption's.
    assert done.returncode == EXIT_DIVERGED, done.stdout[-2000:] + done.stderr[-2000:]
    assert "not finite at iteration 6, found at the check after iteration 8" in done.stderr
    assert _probe_iterations(tmp_path / "run") == [8, 8]
    # No checkpoint of anything after iteration 5; the divergence outranks the preemption.
    assert not list((tmp_path / "run").glob("*checkpoint*"))
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["state"] == "diverged"


@pytest.mark.slow
def test_a_sigterm_on_one_rank_preempts_every_rank_within_check_every(tmp_path):
    done = _two_ranks(tmp_path, fault_sigterm_rank=0, fault_sigterm_at=3)
    assert done.returncode == EXIT_PREEMPTED, done.stdout[-2000:] + done.stderr[-2000:]
    assert "PREEMPTED by" in done.stdout and "after iteration 8" in done.stdout
    assert (tmp_path / "run" / "latest_iter_checkpoint_8.pt").exists()


@pytest.mark.slow
def test_a_preempted_run_exits_75_even_when_a_rank_aborts_as_it_exits(tmp_path):
    done = _two_ranks(
        tmp_path, fault_sigterm_rank=0, fault_sigterm_at=3, fault_abort_at_exit_rank=1
    )
    assert done.returncode == EXIT_PREEMPTED, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "run" / "latest_iter_checkpoint_8.pt").exists()
