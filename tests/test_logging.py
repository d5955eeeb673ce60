"""The logging core: which backends exist, what reaches them, and when they are finished."""

import re
import subprocess
import sys

import pytest
import torch
from ignite.engine import Events

from gatle_ignite import ConfigError
from gatle_ignite.callbacks import logging as logging_module
from gatle_ignite.callbacks.logging import LoggingCallback, _flatten
from tests.conftest import HANG_S
from tests.toy import recording_backend
from tests.toy.trainer import Trainer

RECORDING = "tests.toy.recording_backend"


@pytest.fixture(autouse=True)
def _clear_recordings():
    for store in (recording_backend.LOGGED, recording_backend.WATCHED, recording_backend.FINISHED):
        store.clear()


def test_pbar_is_a_flag_not_a_backend(make_cfg):
    callback = LoggingCallback(make_cfg(logger_name=["pbar", RECORDING])).start()
    assert len(callback.backends) == 1


def test_builtin_short_names_resolve_and_a_misspelt_one_names_the_field(make_cfg):
    assert type(LoggingCallback(make_cfg(logger_name=["text"])).start().backends[0]).__module__ == (
        "gatle_ignite.callbacks.backends.text"
    )
    with pytest.raises(ConfigError, match="logger_name"):
        LoggingCallback(make_cfg(logger_name=["txt"])).start()


def test_other_ranks_build_no_backend(make_cfg, monkeypatch):
    monkeypatch.setattr(logging_module.idist, "get_rank", lambda: 1)
    assert LoggingCallback(make_cfg(logger_name=[RECORDING])).start().backends == []


def test_flatten_spreads_dicts_drops_summaries_and_makes_scalars():
    flat = _flatten(
        {
            "valid/acc": torch.tensor(0.5),
            "valid/cm": torch.tensor([1, 2]),
            "valid/per": {"a": torch.tensor([3.0]), "b": 4},
            "valid/summary_table": "x",
        }
    )
    assert flat == {"valid/acc": 0.5, "valid/cm": [1, 2], "valid/per_a": 3.0, "valid/per_b": 4}


def test_a_run_logs_epochs_lr_and_eval_metrics_then_finishes_cleanly(make_cfg):
    cfg = make_cfg(max_epochs=2, logger_name=[RECORDING], log_every=2)
    Trainer(0, cfg).fit()
    logged = recording_backend.LOGGED
    train = [(m, s, e) for m, s, e in logged if "train/loss_avg" in m]
    # One record per epoch, at the global iteration of the epoch's end, every engine inside.
    assert [(s, e) for _, s, e in train] == [(4, 1), (8, 2)]
    assert all("valid/acc" in m for m, _, _ in train)
    lrs = [(s, e) for m, s, e in logged if "train/lr_0" in m]
    assert lrs == [(2, 1), (4, 1), (6, 2), (8, 2)]
    # The loss of those steps, read at the check the logging forced.
    assert [s for m, s, _ in logged if "train/loss" in m] == [2, 4, 6, 8]
    valid = [e for m, _, e in logged if "valid/acc" in m]
    assert valid == [1, 2]
    assert recording_backend.FINISHED == [False]


class _SeesPoints(Trainer):
    """Notes, after each iteration's handlers, the iterations whose points are written."""

    def attach_progress(self):
        super().attach_progress()
        self.seen = []

        @self.engines["trainer"].on(Events.ITERATION_COMPLETED)
        def _note(engine):
            written = [s for m, s, _ in recording_backend.LOGGED if "train/loss" in m]
            self.seen.append((engine.state.iteration, written))


def _points_cfg(make_cfg):
    return make_cfg(max_epochs=1, logger_name=[RECORDING], log_every=1, check_every=1)


def test_a_point_is_written_once_its_loss_is_read_when_the_last_write_is_long_enough_ago(
    make_cfg, monkeypatch
):
    monkeypatch.setattr(logging_module, "POINTS_WRITTEN_EVERY_S", 0.0)
    task = _SeesPoints(0, _points_cfg(make_cfg))
    task.fit()
    assert task.seen == [(i, list(range(1, i + 1))) for i in range(1, 5)]


def test_points_read_within_the_interval_are_written_together_at_the_epochs_end(
    make_cfg, monkeypatch
):
    monkeypatch.setattr(logging_module, "POINTS_WRITTEN_EVERY_S", 1e9)
    task = _SeesPoints(0, _points_cfg(make_cfg))
    task.fit()
    assert task.seen == [(i, []) for i in range(1, 5)]
    steps = [
        s for m, s, _ in recording_backend.LOGGED if "train/loss" in m or "train/loss_avg" in m
    ]
    # In order, before the epoch's record.
    assert steps == [1, 2, 3, 4, 4]


def test_a_run_that_fails_mid_epoch_writes_the_points_it_read(make_cfg, monkeypatch):
    monkeypatch.setattr(logging_module, "POINTS_WRITTEN_EVERY_S", 1e9)
    task = Trainer(0, _points_cfg(make_cfg)).setup()

    @task.engines["trainer"].on(Events.ITERATION_COMPLETED(once=3))
    def _fail(_engine):
        raise RuntimeError("the data went away")

    with pytest.raises(RuntimeError, match="the data went away"):
        task.fit()
    # Iteration 3 failed before its point was taken.
    assert [s for m, s, _ in recording_backend.LOGGED if "train/loss" in m] == [1, 2]
    assert recording_backend.FINISHED == [True]


def test_watch_grad_watches_once_and_logs_the_gradient_norm(make_cfg):
    cfg = make_cfg(max_epochs=1, logger_name=[RECORDING], log_every=1, watch_grad=True)
    task = Trainer(0, cfg)
    task.fit()
    assert recording_backend.WATCHED == [task.model]
    norms = [m["train/grad_norm"] for m, _, _ in recording_backend.LOGGED if "train/grad_norm" in m]
    assert len(norms) == 4 and all(n > 0 for n in norms)


def test_an_early_stop_is_a_clean_finish(make_cfg):
    scripted = {"acc": {"cls_name": "tests.toy.scripted_metric", "params": {"values": [0.5]}}}
    cfg = make_cfg(
        max_epochs=10, logger_name=[RECORDING], early_stop_patience=1, val_metrics=scripted
    )
    task = Trainer(0, cfg)
    task.fit()
    assert task.engines["trainer"].state.epoch == 2
    assert recording_backend.FINISHED == [False]


def test_pbar_replaces_the_text_progress_lines_on_a_terminal(make_cfg, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    Trainer(0, make_cfg(max_epochs=2, logger_name=["pbar"])).fit()
    captured = capsys.readouterr()
    assert " TRAIN epoch " not in captured.out
    assert "train [2/2]: [4/4]" in captured.err
    # Each eval bar says which split it is; the loss sits inside the brackets, after the rate,
    # not behind a stray comma after the bar.
    assert "valid: [1/2]" in captured.err
    assert re.search(r"it/s, loss=[\d.]+\]", captured.err)
    assert "|, " not in captured.err


def test_pbar_writes_plain_lines_when_its_stream_is_no_terminal(make_cfg, capsys):
    Trainer(0, make_cfg(max_epochs=1, logger_name=["pbar"])).fit()
    captured = capsys.readouterr()
    assert " TRAIN epoch 1: 4/4 (100%) | loss " in captured.out
    # No bar redrawing itself with carriage returns and cursor moves into a log file.
    assert "\r" not in captured.out + captured.err and "\x1b[" not in captured.out + captured.err


def test_a_text_only_run_imports_no_optional_backend(tmp_path):
    code = (
        "import sys; sys.path.insert(0, '.');"
        "from tests.toy.config import toy_config;"
        "from tests.toy.trainer import Trainer;"
        f"Trainer(0, toy_config(save_dir={str(tmp_path)!r}, logger_name=['text'])).fit();"
        "bad = [m for m in ('wandb', 'requests', 'mlflow', 'tensorboard') if m in sys.modules];"
        "print('OPTIONAL', bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=HANG_S
    ).stdout
    assert "OPTIONAL []" in out


def test_a_crash_while_building_finishes_the_started_backends_as_failed(make_cfg):
    class BrokenModel(Trainer):
        def build_model(self):
            raise RuntimeError("no model today")

    with pytest.raises(RuntimeError, match="no model today"):
        BrokenModel(0, make_cfg(logger_name=[RECORDING])).fit()
    assert recording_backend.FINISHED == [True]


def test_the_text_backend_writes_each_block_at_once(count_stdout_writes):
    from gatle_ignite.callbacks.backends.text import Backend as TextBackend

    writes = count_stdout_writes()
    TextBackend(None).log({"valid/acc": 0.25, "train/loss_avg": 0.5}, epoch=3)
    TextBackend(None).log({"train/lr_0": 0.1}, step=7)
    assert writes == [
        "--- epoch 3 ---\ntrain  loss_avg 0.5\nvalid  acc 0.25\n",
        "--- step 7 ---\ntrain  lr_0 0.1\n",
    ]


def test_progress_and_text_logs_are_silent_without_a_stdout(make_cfg, monkeypatch):
    # A daemonised process or pythonw has sys.stdout None; print() stays silent there.
    task = Trainer(0, make_cfg(max_epochs=1, logger_name=["text"]))
    task.setup()
    monkeypatch.setattr("sys.stdout", None)
    task.fit()
    assert task.engines["trainer"].state.epoch == 1


class OwnLogger:
    """A task's own logger object with 0.4's protocol and nothing newer: it logs each epoch's
    metrics itself."""

    def __init__(self):
        self.logged, self.finished = [], []

    def log(self, metrics, step=None, epoch=None):
        self.logged.append((dict(metrics), epoch))

    def watch(self, model):
        pass

    def start(self):
        return self

    def on_train_epoch_end(self, trainer, optimizer):
        trainer.add_event_handler(
            Events.EPOCH_COMPLETED, lambda e: self.log(e.state.metrics, epoch=e.state.epoch)
        )

    def on_train_iteration(self, trainer, model):
        pass

    def on_valid_epoch_end(self, trainer, engine):
        engine.add_event_handler(
            Events.EPOCH_COMPLETED, lambda e: self.log(e.state.metrics, epoch=trainer.state.epoch)
        )

    def on_completion(self, trainer):
        pass

    def finish(self, failed=False):
        self.finished.append(failed)


class OwnLoggerTrainer(Trainer):
    def setup(self):
        super().setup()
        if not isinstance(self.logger, OwnLogger):
            self.logger = OwnLogger()
        return self


@pytest.mark.parametrize("resume", [False, True])
def test_a_task_logger_of_its_own_with_04s_methods_only_logs_the_run(make_cfg, resume):
    if resume:
        Trainer(0, make_cfg(max_epochs=1)).fit()
    task = OwnLoggerTrainer(0, make_cfg(max_epochs=2, resume=resume)).fit()
    # Resumed after epoch 1, the run logs only epoch 2.
    epochs = [epoch for metrics, epoch in task.logger.logged if "valid/acc" in metrics]
    assert epochs == ([2] if resume else [1, 2])
    assert task.logger.finished == [False]


def test_a_logger_set_after_a_scripts_setup_is_the_one_fit_uses(make_cfg):
    task = Trainer(0, make_cfg(max_epochs=1)).setup()
    task.logger = OwnLogger()
    task.fit()
    assert [epoch for metrics, epoch in task.logger.logged if "train/loss_avg" in metrics] == [1]
    assert task.logger.finished == [False]


def test_a_progress_line_says_how_old_a_loss_read_earlier_is(capsys):
    from ignite.engine import Engine

    from gatle_ignite.trainer.progress import ProgressLines

    reads = {2: (2, 0.75), 4: (2, 0.75)}
    engine = Engine(lambda engine, batch: None)
    ProgressLines("TRAIN", every=2, loss=lambda: reads[engine.state.iteration]).attach(engine)
    engine.run(range(4), max_epochs=1)
    lines = capsys.readouterr().out.splitlines()
    assert "| loss 0.75 |" in lines[0]
    # Read at iteration 2, shown at 4: the line says so rather than pass it off as current.
    assert "| loss 0.75 (iteration 2) |" in lines[1]


# ---- progress lines in a log file ----


def _lines_at(seconds_apart, iterations=100):
    """The iterations a line is printed at, on a fake clock one second per iteration."""
    from ignite.engine import Engine

    from gatle_ignite.trainer.progress import ProgressLines

    engine = Engine(lambda engine, batch: None)
    printed = []
    lines = ProgressLines(
        "TRAIN", every=1, seconds_apart=seconds_apart, clock=lambda: float(engine.state.iteration)
    )
    lines.attach(engine)

    @engine.on(Events.ITERATION_COMPLETED)
    def _note(_engine):
        printed.append(lines._last_line)

    engine.run(range(iterations), max_epochs=1)
    return sorted({int(at) for at in printed if at})


def test_off_a_terminal_progress_lines_are_seconds_apart_on_the_clock(capsys):
    # One second per iteration, 30 s apart: a line at 30, 60 and 90 s, none at the start.
    assert _lines_at(30) == [30, 60, 90]
    out = capsys.readouterr().out
    assert [re.search(r"epoch 1: (\d+)/100", line)[1] for line in out.splitlines()] == [
        "30",
        "60",
        "90",
    ]
    # 0: a line at every point the cadence reaches, as on a terminal.
    assert _lines_at(0) == list(range(1, 101))


def test_a_run_into_a_log_file_prints_its_epoch_blocks_and_no_line_each_tenth(make_cfg, capsys):
    # capsys's stdout is no terminal, like a log file; the run takes far less than 30 s.
    Trainer(0, make_cfg(max_epochs=2, logger_name=["text"], progress_seconds=30)).fit()
    out = capsys.readouterr().out
    assert "TRAIN epoch" not in out
    assert "--- epoch 1/2 (iteration 4) ---" in out and "--- epoch 2/2 (iteration 8) ---" in out
    # The same run with 0 prints a line at each point of the cadence (every iteration here).
    Trainer(0, make_cfg(max_epochs=2, logger_name=["text"], replace_run=True)).fit()
    assert capsys.readouterr().out.count(" TRAIN epoch ") == 8


def test_on_a_terminal_the_progress_lines_ignore_progress_seconds(make_cfg, capsys, monkeypatch):
    class Terminal:
        """stdout as a terminal has it: isatty() is true."""

        def __init__(self, stream):
            self.stream = stream

        def write(self, text):
            return self.stream.write(text)

        def flush(self):
            self.stream.flush()

        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Terminal(sys.stdout))
    Trainer(0, make_cfg(max_epochs=1, logger_name=["text"], progress_seconds=30)).fit()
    assert capsys.readouterr().out.count(" TRAIN epoch 1: ") == 4


def test_progress_seconds_must_be_a_number_of_seconds(make_cfg):
    from gatle_ignite.config.values import check_values

    with pytest.raises(ConfigError, match="progress_seconds"):
        check_values(make_cfg(progress_seconds=-1))
    check_values(make_cfg(progress_seconds=2.5))
    check_values(make_cfg(progress_seconds=10))


class SpyLogger:
    """A 0.4 test's spy: 0.4's logger protocol, recording each call, with no ``log`` method."""

    def __init__(self):
        self.calls = []

    def start(self):
        return self

    def on_train_epoch_end(self, trainer, optimizer):
        self.calls.append("on_train_epoch_end")

    def on_train_iteration(self, trainer, model):
        self.calls.append("on_train_iteration")

    def on_valid_epoch_end(self, trainer, engine):
        self.calls.append("on_valid_epoch_end")

    def on_completion(self, trainer):
        trainer.add_event_handler(Events.COMPLETED, lambda _: self.calls.append("completed"))

    def finish(self, failed=False):
        self.calls.append(f"finish(failed={failed})")


class FinishOnlyLogger(SpyLogger):
    on_train_epoch_end = on_train_iteration = on_valid_epoch_end = on_completion = None


@pytest.mark.parametrize(
    ("logger", "calls"),
    [
        (
            SpyLogger,
            [
                "on_train_epoch_end",
                "on_train_iteration",
                "on_valid_epoch_end",
                "completed",
                "finish(failed=False)",
            ],
        ),
        (FinishOnlyLogger, ["finish(failed=False)"]),
    ],
)
def test_a_logger_without_a_method_is_skipped_for_that_method(make_cfg, logger, calls):
    # Each epoch's perf/ record goes to log(), which neither has: a call a logger cannot take
    # is left out, and the run trains to its end.
    task = Trainer(0, make_cfg(max_epochs=2)).setup()
    task.logger = logger()
    task.fit()
    assert task.engines["trainer"].state.epoch == 2
    assert task.logger.calls == calls
