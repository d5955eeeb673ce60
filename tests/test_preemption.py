"""Preemption in one process: a signal to the running trainer ends it at an iteration boundary."""

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ignite.engine import Events

from gatle_ignite.cli.status import run_status
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.trainer.preemption import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    Interrupted,
    Preempted,
    preemption_signals,
)
from tests.conftest import HANG_S, ROOT, child_env
from tests.toy.trainer import Trainer


class SignalledAt(Trainer):
    """Sends itself ``signals`` (SIGTERM) while preparing the batch of one iteration."""

    def __init__(self, local_rank, cfg, at, signals=(signal.SIGTERM,)):
        super().__init__(local_rank, cfg)
        self.at = at
        self.signals = signals
        self.watched_before_signal = []

    def prep_batch(self, batch, split="train", **kwargs):
        trainer = self.engines["trainer"]
        if split == "train":
            stop = self._preemption.at_iteration
            watched = trainer.has_event_handler(stop, Events.ITERATION_COMPLETED)
            self.watched_before_signal.append(watched)
            if trainer.state.iteration == self.at:
                for signum in self.signals:
                    os.kill(os.getpid(), signum)
        return super().prep_batch(batch, split=split, **kwargs)


def _files(cfg):
    return sorted(path.name for path in Path(cfg.save_dir).glob("*.pt"))


def test_a_signal_mid_epoch_saves_that_iteration_and_exits_75(make_cfg):
    # 4 iterations per epoch; the signal arrives during iteration 6 (epoch 2).
    cfg = make_cfg(max_epochs=3)
    task = SignalledAt(0, cfg, at=6)
    with pytest.raises(Preempted) as raised:
        task.fit()
    assert raised.value.code == EXIT_PREEMPTED
    assert "after iteration 6" in str(raised.value)
    assert "latest_iter_checkpoint_6.pt" in _files(cfg)
    assert task.engines["trainer"].state.iteration == 6
    # A single process checks nothing on every iteration until a signal asks it to.
    assert task.watched_before_signal[:6] == [False] * 6


def test_a_signal_at_an_epochs_last_iteration_stops_after_the_epoch_checkpoint(make_cfg):
    cfg = make_cfg(max_epochs=3)
    task = SignalledAt(0, cfg, at=4)
    with pytest.raises(Preempted) as raised:
        task.fit()
    assert "after iteration 4" in str(raised.value)
    files = _files(cfg)
    assert "latest_epoch_checkpoint_1.pt" in files
    assert not [name for name in files if name.startswith("latest_iter")]


def test_the_signal_handler_is_restored_after_the_run(make_cfg):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted):
        SignalledAt(0, make_cfg(max_epochs=2), at=2).fit()
    assert signal.getsignal(signal.SIGTERM) is before
    # The next run in this process is not preempted by the last one's request.
    task = Trainer(0, make_cfg(max_epochs=1, save_dir=make_cfg().save_dir + "_next")).fit()
    assert task.engines["trainer"].state.epoch == 1


def test_a_repeated_signal_goes_to_on_repeat_and_the_first_stays_the_request():
    forwarded, repeats = [], []

    def forward_to():
        forwarded.append(True)
        return []

    with preemption_signals(forward_to=forward_to, on_repeat=repeats.append) as request:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        seen = request.signal
    assert seen == signal.SIGUSR1
    assert repeats == [signal.SIGTERM, signal.SIGUSR1]
    # Only the first is passed on: the repeats are on_repeat's to act on.
    assert forwarded == [True]


def test_ctrl_c_saves_that_iteration_exits_130_and_leaves_the_run_resumable(make_cfg, capfd):
    cfg = make_cfg(max_epochs=3)
    task = SignalledAt(0, cfg, at=6, signals=(signal.SIGINT,))
    with pytest.raises(Preempted) as raised:
        task.fit()
    assert raised.value.code == EXIT_INTERRUPTED
    out, err = capfd.readouterr()
    # Said at once, before the iteration ends: a second Ctrl-C counts from this line on.
    assert err.count("Ctrl-C: the run stops after this iteration, resumable; Ctrl-C again") == 1
    line = [text for text in out.splitlines() if "SIGINT" in text]
    assert line == [
        f"INTERRUPTED by SIGINT after iteration 6: saved {cfg.save_dir}/"
        f"latest_iter_checkpoint_6.pt; run the same command with --override resume=True to "
        f"continue."
    ]
    assert "latest_iter_checkpoint_6.pt" in _files(cfg)
    assert Manifest.read(cfg.save_dir).state == "preempted"
    assert run_status(cfg.save_dir) == EXIT_PREEMPTED


def test_a_second_ctrl_c_stops_at_once_without_saving_and_stays_resumable(make_cfg, capsys):
    cfg = make_cfg(max_epochs=3)
    task = SignalledAt(0, cfg, at=6, signals=(signal.SIGINT, signal.SIGINT))
    with pytest.raises(Interrupted) as raised:
        task.fit()
    assert raised.value.code == EXIT_INTERRUPTED
    assert "stopped at once by a second SIGINT" in capsys.readouterr().out
    # Stopped inside iteration 6, before it finished: nothing of it is saved.
    assert not [name for name in _files(cfg) if name.startswith("latest_iter")]
    manifest = Manifest.read(cfg.save_dir)
    assert manifest.state == "interrupted" and manifest.trained_iteration == 4
    assert run_status(cfg.save_dir) == EXIT_PREEMPTED
    resumed = Trainer(0, make_cfg(max_epochs=3, resume=True)).fit()
    assert resumed.engines["trainer"].state.iteration == 12


def test_a_repeated_sigterm_to_one_process_is_still_one_request(make_cfg):
    cfg = make_cfg(max_epochs=3)
    task = SignalledAt(0, cfg, at=6, signals=(signal.SIGTERM, signal.SIGTERM))
    with pytest.raises(Preempted) as raised:
        task.fit()
    assert raised.value.code == EXIT_PREEMPTED
    assert "latest_iter_checkpoint_6.pt" in _files(cfg)


def test_the_sigint_handler_is_restored_after_the_run(make_cfg):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Preempted):
        SignalledAt(0, make_cfg(max_epochs=2), at=2, signals=(signal.SIGINT,)).fit()
    assert signal.getsignal(signal.SIGINT) is before


def _metric_rows(cfg):
    """metrics.csv without its wall-time column and the perf/ rows, which time the run."""
    with open(Path(cfg.save_dir) / "metrics.csv", newline="") as handle:
        return [row[1:] for row in csv.reader(handle) if not row[3].startswith("perf/")]


def _logged(make_cfg, name, **fields):
    defaults = {
        "max_epochs": 3,
        "log_every": 1,
        "logger_name": ["csv"],
        "model_params": {"dropout": 0.3},
        "train_metrics": {"acc": {"cls_name": "tests.toy.metric"}},
    }
    return make_cfg(save_dir=str(Path(make_cfg().save_dir).parent / name), **defaults | fields)


@pytest.mark.parametrize("at", [5, 6])
def test_after_a_mid_epoch_resume_metrics_csv_equals_the_uninterrupted_runs(make_cfg, at):
    reference = _logged(make_cfg, "reference")
    Trainer(0, reference).fit()
    cfg = _logged(make_cfg, "run")
    with pytest.raises(Preempted):
        SignalledAt(0, cfg, at=at).fit()
    Trainer(0, _logged(make_cfg, "run", resume=True)).fit()
    rows = _metric_rows(cfg)
    assert any(row[2] == "train/acc" for row in rows)
    assert rows == _metric_rows(reference)


def test_a_train_metric_that_cannot_give_its_state_is_named_in_one_warning(make_cfg):
    scripted = {"count": {"cls_name": "tests.toy.scripted_metric"}}
    cfg = _logged(make_cfg, "run", save_every_iters=1, max_epochs=1, train_metrics=scripted)
    with pytest.warns(
        UserWarning, match="train metric 'train/count' cannot be checkpointed"
    ) as seen:
        Trainer(0, cfg).fit()
    assert sum("cannot be checkpointed" in str(w.message) for w in seen) == 1


@pytest.mark.parametrize(
    ("every", "kept"),
    [
        (0, []),
        (
            2,
            [
                "latest_iter_checkpoint_10.pt",
                "latest_iter_checkpoint_2.pt",
                "latest_iter_checkpoint_6.pt",
            ],
        ),
    ],
)
def test_a_completed_run_keeps_no_checkpoint_of_an_interruption_it_recovered_from(
    make_cfg, every, kept
):
    cfg = make_cfg(max_epochs=3, save_every_iters=every, n_saved=None)
    with pytest.raises(Preempted):
        SignalledAt(0, cfg, at=5).fit()
    assert "latest_iter_checkpoint_5.pt" in _files(cfg)
    Trainer(0, make_cfg(max_epochs=3, save_every_iters=every, n_saved=None, resume=True)).fit()
    assert [name for name in _files(cfg) if name.startswith("latest_iter")] == kept
    indexed = [e.file for e in Manifest.read(cfg.save_dir).checkpoints if e.kind == "latest_iter"]
    assert sorted(indexed) == kept


# A worker shielded as a run's DataLoader workers are, hit by a burst of signals (a Ctrl-C goes
# to the whole process group, twice), then ended as multiprocessing ends workers at exit.
_SIGNAL_BURST = """
import multiprocessing, os, signal, sys, time
from gatle_ignite.trainer.preemption import _ShieldThen, _lift_shields, _main_exiting_flag

shield = _ShieldThen(None, _main_exiting_flag(multiprocessing.get_context("fork")))
reader, writer = os.pipe()
pid = os.fork()
if pid == 0:
    shield(0)
    os.write(writer, b"x")
    while True:
        time.sleep(0.001)
os.read(reader, 1)
for _ in range(int(sys.argv[1])):
    os.kill(pid, signal.SIGINT)
_lift_shields()
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
print("worker exit", os.waitstatus_to_exitcode(status))
"""


def test_a_burst_of_signals_never_locks_up_a_shielded_worker():
    """The shield's handler reads the main process's exit flag: a signal landing while it runs
    must find no lock held, or the worker hangs, and the main process with it at exit (the
    double Ctrl-C test hung CI so)."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_BURST, "3000"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=ROOT,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "worker exit 0"
