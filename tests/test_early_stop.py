"""Early stopping: patience, the after-floor, cadence, checkpointed counters, messages."""

import re
import subprocess
import sys

import pytest
import torch

from gatle_ignite import ConfigError, EngineSpec
from gatle_ignite.utils.checkpoints import find_latest_checkpoint
from tests.conftest import HANG_S, ROOT
from tests.toy.config_file import write_toy_config
from tests.toy.trainer import Trainer


def _scripted(values):
    return {"acc": {"cls_name": "tests.toy.scripted_metric", "params": {"values": list(values)}}}


def _fast(make_cfg, **fields):
    fields.setdefault("train_ds_params", {"n": 16, "bs": 16})
    fields.setdefault("valid_ds_params", {"n": 16, "bs": 16})
    fields.setdefault("max_epochs", 20)
    return make_cfg(**fields)


def _final_epoch(cfg, trainer_cls=Trainer):
    task = trainer_cls(0, cfg)
    task.fit()
    return task.engines["trainer"].state.epoch


def test_a_flat_metric_with_patience_3_stops_at_epoch_4(make_cfg, tmp_path, capsys):
    cfg = _fast(make_cfg, early_stop_patience=3, val_metrics=_scripted([0.5]))
    assert _final_epoch(cfg) == 4
    out = capsys.readouterr().out
    assert "[early-stop] valid: 1/3 evaluations with no improvement" in out
    assert "[early-stop] valid: no improvement for 3 evaluations -- stopping at epoch 4" in out
    names = [p.name for p in (tmp_path / "run").iterdir()]
    assert "latest_epoch_checkpoint_4.pt" in names
    # 0.4's rule: a tie moves the best file to the newest epoch (CONTRACT 7.2, 10.2).
    assert [n for n in names if n.startswith("valid_best")] == [
        "valid_best_result_checkpoint_4_0.5000.pt"
    ]


def test_the_after_floor_delays_counting(make_cfg):
    cfg = _fast(make_cfg, early_stop_patience=3, early_stop_after=12, val_metrics=_scripted([0.5]))
    assert _final_epoch(cfg) == 15


def test_patience_counts_evaluations_not_epochs(make_cfg):
    cfg = _fast(make_cfg, early_stop_patience=2, every_val=3, val_metrics=_scripted([0.5]))
    assert _final_epoch(cfg) == 9


def test_no_patience_trains_every_epoch_and_improvement_never_stops(make_cfg):
    assert _final_epoch(_fast(make_cfg, val_metrics=_scripted([0.5]))) == 20
    rising = _scripted([i / 100 for i in range(1, 30)])
    # A second run into the same save_dir replaces the first one.
    cfg = _fast(make_cfg, early_stop_patience=2, val_metrics=rising, replace_run=True)
    assert _final_epoch(cfg) == 20


def test_counters_are_checkpointed(make_cfg, tmp_path):
    cfg = _fast(make_cfg, max_epochs=4, early_stop_patience=8, val_metrics=_scripted([0.5]))
    _final_epoch(cfg)
    state = torch.load(find_latest_checkpoint(tmp_path / "run"), weights_only=True)
    assert state["early_stop_valid"]["counter"] == 3
    assert state["early_stop_valid"]["best_score"] == 0.5


def test_a_resumed_run_stops_at_the_same_epoch(make_cfg, tmp_path):
    values = [0.1, 0.2, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
    straight = _fast(
        make_cfg, early_stop_patience=3, val_metrics=_scripted(values), save_dir=str(tmp_path / "a")
    )
    assert _final_epoch(straight) == 6
    first = _fast(
        make_cfg,
        max_epochs=4,
        early_stop_patience=3,
        val_metrics=_scripted(values),
        save_dir=str(tmp_path / "b"),
    )
    assert _final_epoch(first) == 4
    # The scripted metric restarts from its first value; the counter must not.
    rest = _fast(
        make_cfg,
        early_stop_patience=3,
        val_metrics=_scripted([0.3]),
        resume=True,
        accept_changes=["val_metrics"],
        save_dir=str(tmp_path / "b"),
    )
    assert _final_epoch(rest) == 6


def test_a_declared_engine_stops_only_with_its_own_counter(make_cfg, capsys):
    class WithProbe(Trainer):
        def eval_specs(self):
            return super().eval_specs() + (EngineSpec.for_split("probe"),)

    cfg = _fast(
        make_cfg,
        early_stop_patience=3,
        val_metrics=_scripted([0.5]),
        probe_ds_name="tests.toy.data",
        probe_ds_params={"n": 16, "bs": 16},
        probe_metrics=_scripted([0.5]),
        every_probe=1,
        probe_score_name="probe/acc",
        probe_early_stop_patience=9,
    )
    assert _final_epoch(cfg, WithProbe) == 4
    out = capsys.readouterr().out
    assert "stopping at epoch 4" in out and "probe: 3/9" in out
    assert "probe: no improvement" not in out


def test_patience_on_an_engine_never_built_is_refused(make_cfg):
    with pytest.raises(ConfigError, match="never builds"):
        Trainer(0, _fast(make_cfg, early_stop_patience=2, every_val=0)).setup()


def test_patience_without_a_score_is_refused(make_cfg):
    with pytest.raises(ConfigError, match="no metric to stop on"):
        Trainer(0, _fast(make_cfg, early_stop_patience=2, score_name=None)).setup()


def test_a_failed_setup_can_be_retried_and_then_gets_its_stopper(make_cfg):
    cfg = _fast(make_cfg, early_stop_patience=2, score_name=None)
    task = Trainer(0, cfg)
    with pytest.raises(ConfigError):
        task.setup()
    assert task._built is False
    cfg.score_name = "valid/acc"
    task.setup()
    assert list(task._early_stoppers) == ["early_stop_valid"]


def test_inference_mode_builds_no_stopper(make_cfg):
    cfg = _fast(make_cfg, early_stop_patience=2)
    cfg.run = True
    task = Trainer(0, cfg).setup()
    assert task._early_stoppers == {} and task._post_eval == {}


def test_an_old_state_without_newer_keys_loads_but_a_missing_counter_does_not(make_cfg):
    task = Trainer(0, _fast(make_cfg, early_stop_patience=2)).setup()
    stopper = task._early_stoppers["early_stop_valid"]
    stopper.load_state_dict({"counter": 1, "best_score": 0.25})
    assert stopper.state_dict()["counter"] == 1
    with pytest.raises(ValueError, match="counter"):
        stopper.load_state_dict({"best_score": 0.25})


def _judged_epochs(out) -> list:
    """For each [early-stop] line, the epoch of the block printed above it."""
    judged, epoch = [], None
    for line in out.splitlines():
        header = re.match(r"--- epoch (\d+)/", line)
        if header:
            epoch = int(header.group(1))
        elif line.startswith("[early-stop]"):
            judged.append((epoch, line.split(": ", 1)[1]))
    return judged


def test_each_early_stop_line_comes_under_the_epoch_block_it_judges(make_cfg, capsys):
    values = [0.1, 0.2, 0.2, 0.3, 0.3, 0.3]
    scripted = _scripted(values)
    cfg = _fast(make_cfg, early_stop_patience=2, val_metrics=scripted, logger_name=["text"])
    assert _final_epoch(cfg) == 6
    # Epochs 3 and 5 tie the best so far, and 6 ties it again: each line sits under its own
    # epoch's block, never under the epoch before it, which had improved.
    assert _judged_epochs(capsys.readouterr().out) == [
        (3, "1/2 evaluations with no improvement"),
        (5, "1/2 evaluations with no improvement"),
        (6, "no improvement for 2 evaluations -- stopping at epoch 6"),
    ]


def test_a_tie_is_no_improvement_yet_moves_the_best_checkpoint_to_the_newest_epoch(
    make_cfg, tmp_path
):
    cfg = _fast(make_cfg, early_stop_patience=2, val_metrics=_scripted([0.1, 0.2, 0.2, 0.2]))
    # Epochs 3 and 4 tie epoch 2: no improvement, so patience 2 runs out at epoch 4.
    assert _final_epoch(cfg) == 4
    best = sorted(p.name for p in (tmp_path / "run").glob("valid_best_result_*"))
    # The best file follows 0.4's rule all the same: the newest of the tied epochs.
    assert best == ["valid_best_result_checkpoint_4_0.2000.pt"]


@pytest.mark.parametrize("verbosity", [0, 1, 2])
def test_ignites_own_stop_line_shows_only_at_verbosity_2(tmp_path, verbosity):
    config = write_toy_config(
        tmp_path / "cfg.py",
        save_dir=str(tmp_path / "run"),
        max_epochs=5,
        early_stop_patience=1,
        val_metrics=_scripted([0.5]),
        verbosity=verbosity,
    )
    done = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    assert "[early-stop] valid: no improvement for 1 evaluations" in done.stdout
    assert ("EarlyStopping: Stop training" in done.stderr) == (verbosity == 2)
