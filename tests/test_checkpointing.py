"""Checkpoints: names, rotation, best selection, divergence, resume, eval loading, safety."""

import copy
import os
import time
from pathlib import Path

import pytest
import torch
from ignite.engine import Events

from gatle_ignite import ConfigError
from gatle_ignite.trainer.checkpointing import _to_save
from gatle_ignite.utils.checkpoints import find_best_checkpoint, find_latest_checkpoint
from tests.toy.trainer import Trainer


def _files(save_dir):
    """The checkpoint files in ``save_dir``."""
    return sorted(p.name for p in save_dir.glob("*.pt"))


def _scripted(values):
    return {"acc": {"cls_name": "tests.toy.scripted_metric", "params": {"values": list(values)}}}


def _eval_cfg(cfg, which="best"):
    cfg = copy.deepcopy(cfg)
    cfg.run = True
    cfg.load_from_ckpt = which
    return cfg


class Counter:
    """Extra state: counts optimizer steps."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


class CountingTrainer(Trainer):
    def build_model(self):
        self.counter = Counter()
        return super().build_model()

    def backward(self, loss, step=True):
        super().backward(loss, step=step)
        if step:
            self.counter.value += 1

    def extra_to_save(self):
        return {"counter": self.counter}


def test_latest_and_best_files_have_the_contract_names(make_cfg, tmp_path):
    cfg = make_cfg(max_epochs=2, n_saved=None, val_metrics=_scripted([0.5, 0.25]))
    Trainer(0, cfg).fit()
    assert _files(tmp_path / "run") == [
        "latest_epoch_checkpoint_1.pt",
        "latest_epoch_checkpoint_2.pt",
        "valid_best_result_checkpoint_1_0.5000.pt",
        "valid_best_result_checkpoint_2_0.2500.pt",
    ]


def test_every_checkpoint_loads_with_weights_only(make_cfg, tmp_path):
    cfg = make_cfg(lr_scheduler="gatle_ignite.schedulers.warmup_cosine", early_stop_patience=5)
    CountingTrainer(0, cfg).fit()
    for path in (tmp_path / "run").glob("*.pt"):
        state = torch.load(path, map_location="cpu", weights_only=True)
        assert {"model", "optimizer", "trainer", "run_meta", "scheduler", "counter"} <= set(state)
        assert "early_stop_valid" in state
        assert all(torch.is_tensor(v) for v in state["model"].values())


def test_n_saved_rotates_each_kind(make_cfg, tmp_path):
    cfg = make_cfg(max_epochs=4, n_saved=2, val_metrics=_scripted([0.1, 0.4, 0.3, 0.2]))
    Trainer(0, cfg).fit()
    assert _files(tmp_path / "run") == [
        "latest_epoch_checkpoint_3.pt",
        "latest_epoch_checkpoint_4.pt",
        "valid_best_result_checkpoint_2_0.4000.pt",
        "valid_best_result_checkpoint_3_0.3000.pt",
    ]


def test_score_factor_minus_one_keeps_the_lowest_metric(make_cfg, tmp_path):
    cfg = make_cfg(max_epochs=3, score_factor=-1, val_metrics=_scripted([0.5, 0.25, 0.75]))
    Trainer(0, cfg).fit()
    assert [f for f in _files(tmp_path / "run") if "best" in f] == [
        "valid_best_result_checkpoint_2_-0.2500.pt"
    ]


def test_an_equal_score_moves_the_best_file_to_the_newest_epoch(make_cfg, tmp_path):
    # 0.4's rule (CONTRACT 7.2): the best Checkpoint keeps the newest of equal scores.
    Trainer(0, make_cfg(max_epochs=3, val_metrics=_scripted([0.5]))).fit()
    assert [f for f in _files(tmp_path / "run") if "best" in f] == [
        "valid_best_result_checkpoint_3_0.5000.pt"
    ]


def test_a_non_finite_score_stops_and_saves_nothing_for_that_epoch(make_cfg, tmp_path):
    cfg = make_cfg(
        max_epochs=5, n_saved=None, val_metrics={"late": _scripted([0.5, float("nan")])["acc"]}
    )
    cfg.score_name = "valid/late"
    task = Trainer(0, cfg)
    with pytest.warns(UserWarning, match="valid/late is nan at epoch 2"):
        task.fit()
    assert task.engines["trainer"].state.epoch == 2
    assert _files(tmp_path / "run") == [
        "latest_epoch_checkpoint_1.pt",
        "valid_best_result_checkpoint_1_0.5000.pt",
    ]


def test_divergence_stops_the_run_even_without_checkpoints(make_cfg, tmp_path):
    cfg = make_cfg(max_epochs=5, save_ckpt=False, val_metrics=_scripted([float("inf")]))
    task = Trainer(0, cfg)
    with pytest.warns(UserWarning, match="training stopped"):
        task.fit()
    assert task.engines["trainer"].state.epoch == 1
    assert _files(tmp_path / "run") == []


def test_a_nan_loss_mid_epoch_stops_at_that_iteration(make_cfg, tmp_path):
    cfg = make_cfg(max_epochs=5, train_ds_params={"n": 64, "bs": 16})
    cfg.criterion_params.dict_of_loss_params["bad"] = {
        "cls_name": "tests.toy.nan_loss",
        "weight": 1.0,
        "start_iteration": 6,
    }
    task = Trainer(0, cfg)
    task.fit()
    state = task.engines["trainer"].state
    assert (state.epoch, state.iteration) == (2, 6)
    assert [f for f in _files(tmp_path / "run") if f.startswith("latest")] == [
        "latest_epoch_checkpoint_1.pt"
    ]


def test_resume_continues_to_the_new_max_epochs(make_cfg, tmp_path, capsys):
    Trainer(0, make_cfg(max_epochs=3)).fit()
    task = Trainer(0, make_cfg(max_epochs=5, resume=True))
    task.fit()
    out = capsys.readouterr().out
    assert "RESUMING FROM:" in out and "latest_epoch_checkpoint_3.pt" in out
    assert task.engines["trainer"].state.epoch == 5
    assert "TRAINING COMPLETE after 5 epochs" in out
    assert find_latest_checkpoint(tmp_path / "run").name == "latest_epoch_checkpoint_5.pt"


def test_resumed_weights_equal_the_uninterrupted_run(make_cfg, tmp_path):
    """At an epoch boundary, with a fixed data order: model, optimizer and schedule come back."""
    fields = {
        "train_ds_params": {"n": 64, "bs": 16, "shuffle": False},
        "lr_scheduler": "gatle_ignite.schedulers.step",
        "lr_scheduler_params": {"step_size": 1, "gamma": 0.5},
    }
    straight = Trainer(0, make_cfg(max_epochs=4, save_dir=str(tmp_path / "a"), **fields))
    straight.fit()
    Trainer(0, make_cfg(max_epochs=2, save_dir=str(tmp_path / "b"), **fields)).fit()
    resumed = Trainer(
        0, make_cfg(max_epochs=4, save_dir=str(tmp_path / "b"), resume=True, **fields)
    )
    resumed.fit()
    for key, value in straight.model.state_dict().items():
        assert torch.allclose(value, resumed.model.state_dict()[key], atol=1e-6)


def test_resume_with_nothing_to_resume_warns_and_starts_fresh(make_cfg):
    task = Trainer(0, make_cfg(max_epochs=1, resume=True))
    with pytest.warns(UserWarning, match="starts from scratch"):
        task.fit()
    assert task.engines["trainer"].state.epoch == 1


def test_resume_with_a_changed_max_epochs_warns_about_the_schedule(make_cfg):
    sched = "gatle_ignite.schedulers.cosine"
    Trainer(0, make_cfg(max_epochs=2, lr_scheduler=sched)).fit()
    with pytest.warns(UserWarning, match="keeps its 2-epoch length"):
        Trainer(0, make_cfg(max_epochs=3, lr_scheduler=sched, resume=True)).fit()


def _lrs_per_iteration(task) -> list:
    """Fit ``task``, recording the lr each iteration trains with (after the schedule set it)."""
    task.setup()
    lrs = []
    task.engines["trainer"].add_event_handler(
        Events.ITERATION_STARTED, lambda _: lrs.append(task.optimizer.param_groups[0]["lr"])
    )
    task.fit()
    return lrs


@pytest.mark.parametrize(
    ("schedule", "floor"),
    [("gatle_ignite.schedulers.cosine", 0.0), ("gatle_ignite.schedulers.warmup_cosine", 1e-3)],
)
def test_a_resume_past_the_schedules_end_trains_on_at_its_floor(make_cfg, schedule, floor):
    fields = {"lr_scheduler": schedule, "optimizer_params": {"lr": 0.1}}
    Trainer(0, make_cfg(max_epochs=2, **fields)).fit()
    with pytest.warns(UserWarning, match="keeps its 2-epoch length"):
        extended = _lrs_per_iteration(Trainer(0, make_cfg(max_epochs=4, resume=True, **fields)))
    assert len(extended) == 8 and extended == pytest.approx([floor] * 8)
    # Extended once more: its checkpoints still know the schedule is the 2-epoch one.
    with pytest.warns(UserWarning, match="keeps its 2-epoch length"):
        again = _lrs_per_iteration(Trainer(0, make_cfg(max_epochs=5, resume=True, **fields)))
    assert again == pytest.approx([floor] * 4)


def test_an_accepted_max_epochs_stretches_the_schedule_instead(make_cfg):
    fields = {"lr_scheduler": "gatle_ignite.schedulers.cosine", "optimizer_params": {"lr": 0.1}}
    Trainer(0, make_cfg(max_epochs=2, **fields)).fit()
    accepting = make_cfg(max_epochs=4, resume=True, accept_changes=["max_epochs"], **fields)
    stretched = _lrs_per_iteration(Trainer(0, accepting))
    assert stretched[0] > 0.01 and stretched == sorted(stretched, reverse=True)


def test_resume_warns_about_state_the_checkpoint_lacks(make_cfg, tmp_path):
    Trainer(0, make_cfg(max_epochs=1)).fit()
    with pytest.warns(UserWarning, match=r"checkpoint has no state for \['counter'\]"):
        CountingTrainer(0, make_cfg(max_epochs=2, resume=True)).fit()


def test_extra_state_round_trips_through_save_resume_and_eval(make_cfg, tmp_path):
    cfg = make_cfg(max_epochs=1, every_val=0, train_ds_params={"n": 48, "bs": 16})
    CountingTrainer(0, cfg).fit()
    latest = find_latest_checkpoint(tmp_path / "run")
    assert torch.load(latest, weights_only=True)["counter"] == {"value": 3}
    resumed = CountingTrainer(
        0, make_cfg(max_epochs=1, every_val=0, resume=True, train_ds_params={"n": 48, "bs": 16})
    )
    resumed.setup()
    from gatle_ignite.trainer.checkpointing import load_checkpoints

    load_checkpoints(resumed)
    assert resumed.counter.value == 3
    evaluating = CountingTrainer(0, _eval_cfg(cfg, "latest"))
    evaluating.evaluate()
    assert evaluating.counter.value == 3


def test_eval_of_a_checkpoint_without_the_extra_key_warns(make_cfg, tmp_path):
    cfg = make_cfg(max_epochs=1)
    Trainer(0, cfg).fit()
    with pytest.warns(UserWarning, match="has no 'counter'"):
        CountingTrainer(0, _eval_cfg(cfg)).evaluate()


def test_an_extra_key_colliding_with_the_framework_is_refused(make_cfg):
    class Colliding(Trainer):
        def extra_to_save(self):
            return {"optimizer": self.optimizer}

    with pytest.raises(ConfigError, match="collides"):
        Colliding(0, make_cfg()).setup()


def test_eval_loads_best_or_latest_and_writes_nothing(make_cfg, tmp_path, capsys):
    cfg = make_cfg(max_epochs=3, n_saved=None)
    Trainer(0, cfg).fit()
    run_dir = tmp_path / "run"
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    best = find_best_checkpoint(run_dir, prefix="valid_")
    for which, expected in (("best", best), ("latest", run_dir / "latest_epoch_checkpoint_3.pt")):
        task = Trainer(0, _eval_cfg(cfg, which))
        results = task.evaluate()
        out = capsys.readouterr().out
        assert f"LOADING CHECKPOINT: {expected}" in out
        assert "valid/acc" in results and f"valid/acc: {results['valid/acc']}" in out
        assert task.engines["trainer"].state.epoch == 0
        assert task._post_eval == {}
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before


def test_eval_reproduces_the_trained_models_metric(make_cfg):
    cfg = make_cfg(max_epochs=1, every_val=1)
    task = Trainer(0, cfg)
    task.fit()
    trained = task.engines["evaluator"].state.metrics["valid/acc"]
    assert Trainer(0, _eval_cfg(cfg, "latest")).evaluate()["valid/acc"] == trained


def test_eval_without_a_best_checkpoint_is_a_config_error(make_cfg):
    with pytest.raises(ConfigError, match="no 'best' checkpoint found"):
        Trainer(0, _eval_cfg(make_cfg())).evaluate()


def test_evaluate_outside_inference_mode_is_refused(make_cfg):
    with pytest.raises(ConfigError, match="inference mode"):
        Trainer(0, make_cfg()).evaluate()


def test_model_checkpoint_dir_warm_starts_weights_only(make_cfg, tmp_path, capsys):
    source = Trainer(0, make_cfg(max_epochs=2, save_dir=str(tmp_path / "src")))
    source.fit()
    path = tmp_path / "src" / "latest_epoch_checkpoint_2.pt"
    task = Trainer(0, make_cfg(max_epochs=1, model_checkpoint_dir=str(path)))
    task.setup()
    from gatle_ignite.trainer.checkpointing import load_checkpoints

    assert load_checkpoints(task)
    out = capsys.readouterr().out
    assert f"LOADING MODEL FROM: {path}" in out and "LOADED 4/4 tensors" in out
    for key, value in source.model.state_dict().items():
        assert torch.equal(value, task.model.state_dict()[key])
    assert task.engines["trainer"].state.epoch == 0


def test_a_pickled_object_in_a_checkpoint_is_refused_unexecuted(make_cfg, tmp_path):
    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.save({"model": {}, "payload": Payload()}, run_dir / "latest_epoch_checkpoint_1.pt")
    with pytest.raises(ConfigError, match="refusing to load"):
        Trainer(0, _eval_cfg(make_cfg(), "latest")).evaluate()
    with pytest.raises(ConfigError, match="refusing to load"):
        Trainer(0, make_cfg(resume=True)).fit()
    assert not marker.exists()


def test_to_save_holds_the_contract_keys_in_order(make_cfg):
    task = Trainer(0, make_cfg(lr_scheduler="gatle_ignite.schedulers.step", early_stop_patience=2))
    task.setup()
    assert list(_to_save(task)) == [
        "model",
        "optimizer",
        "trainer",
        "run_meta",
        "early_stop_valid",
        "scheduler",
        "resume_state",
    ]


def test_unconfigured_runs_have_no_early_stop_key(make_cfg, tmp_path):
    Trainer(0, make_cfg(max_epochs=1)).fit()
    state = torch.load(find_latest_checkpoint(tmp_path / "run"), weights_only=True)
    assert not [k for k in state if k.startswith("early_stop")]
    assert state["run_meta"] == {"max_epochs": 1}


def test_find_latest_uses_the_newest_file(tmp_path):
    for epoch in (3, 1, 2):
        (tmp_path / f"latest_epoch_checkpoint_{epoch}.pt").write_bytes(b"")
        time.sleep(0.01)
    assert find_latest_checkpoint(tmp_path).name == "latest_epoch_checkpoint_2.pt"
    assert find_latest_checkpoint(tmp_path / "missing") is None


def test_resuming_with_another_epoch_length_warns(make_cfg):
    Trainer(0, make_cfg(max_epochs=1, train_length=2)).fit()
    with pytest.warns(UserWarning, match="epochs have 2 iterations and this run's have 4"):
        Trainer(0, make_cfg(max_epochs=2, resume=True, accept_changes=["train_length"])).fit()


# ---- best and latest of one epoch: one file on disk when their state is the same ----


def _inode(path):
    return os.stat(path).st_ino


def _best_and_latest(save_dir, epoch):
    best = [p for p in save_dir.glob(f"valid_best_result_checkpoint_{epoch}_*.pt")]
    assert len(best) == 1
    return best[0], save_dir / f"latest_epoch_checkpoint_{epoch}.pt"


def test_an_improving_epoch_links_latest_to_the_best_file_it_equals(make_cfg):
    cfg = make_cfg(max_epochs=2, n_saved=2, val_metrics=_scripted([0.5, 0.6]))
    Trainer(0, cfg).fit()
    for epoch in (1, 2):
        best, latest = _best_and_latest(Path(cfg.save_dir), epoch)
        assert _inode(best) == _inode(latest)
    first, second = (Path(cfg.save_dir) / f"latest_epoch_checkpoint_{e}.pt" for e in (1, 2))
    assert _inode(first) != _inode(second)
    state = torch.load(latest, weights_only=True)
    assert state["trainer"]["iteration"] == 8


def test_state_that_changed_after_the_best_file_is_written_again(make_cfg):
    # Early stopping counts the epoch after the best file is written: latest differs.
    cfg = make_cfg(max_epochs=1, early_stop_patience=3, val_metrics=_scripted([0.5]))
    Trainer(0, cfg).fit()
    best, latest = _best_and_latest(Path(cfg.save_dir), 1)
    assert _inode(best) != _inode(latest)


def test_weights_changed_in_place_after_the_best_file_are_written_again(make_cfg):
    class Nudged(Trainer):
        def attach_runner(self):
            super().attach_runner()

            @self.engines["trainer"].on(Events.EPOCH_COMPLETED)
            def nudge(_engine):
                with torch.no_grad():
                    next(self.model.parameters()).add_(1.0)

    cfg = make_cfg(max_epochs=1, val_metrics=_scripted([0.5]))
    task = Nudged(0, cfg)
    task.fit()
    best, latest = _best_and_latest(Path(cfg.save_dir), 1)
    assert _inode(best) != _inode(latest)
    name = next(iter(task.model.state_dict()))
    saved = {p: torch.load(p, weights_only=True)["model"][name] for p in (best, latest)}
    assert torch.equal(saved[best] + 1.0, saved[latest])


def test_without_hard_links_the_latest_file_is_written(make_cfg, monkeypatch):
    def no_links(*_args):
        raise PermissionError("this file system has no hard links")

    monkeypatch.setattr("gatle_ignite.run.unchanged_state.os.link", no_links)
    cfg = make_cfg(max_epochs=1, val_metrics=_scripted([0.5]))
    Trainer(0, cfg).fit()
    best, latest = _best_and_latest(Path(cfg.save_dir), 1)
    assert _inode(best) != _inode(latest)
    assert torch.load(latest, weights_only=True)["trainer"]["iteration"] == 4
    assert not list(Path(cfg.save_dir).glob(".link-*"))
