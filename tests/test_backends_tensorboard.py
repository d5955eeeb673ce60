"""The tensorboard backend: event files read back with TensorBoard's own event reader."""

import contextlib
import os

import pytest
import torch

from gatle_ignite.trainer import model_graph
from tests.backend_fixtures import need, synthetic_cfg, tensorboard_series, train
from tests.toy.noisy_trainer import Trainer as NoisyTrainer
from tests.toy.trainer import Trainer


def test_event_files_hold_every_scalar_at_its_step(tmp_path):
    need("tensorboard")
    cfg = synthetic_cfg(tmp_path / "run", ["tensorboard"])
    train(cfg)

    assert os.listdir(os.path.join(cfg.save_dir, "tensorboard"))
    # Epoch-level metrics sit at their epoch, iteration-level ones at their iteration.
    acc = tensorboard_series(cfg.save_dir, "valid/acc")
    assert [step for step, _ in acc] == [8, 16]
    assert all(0.0 <= value <= 1.0 for _, value in acc)
    assert [step for step, _ in tensorboard_series(cfg.save_dir, "train/loss_avg")] == [8, 16]
    # The synthetic task's adamw names its param groups: each rate is under its name.
    lrs = tensorboard_series(cfg.save_dir, "lr/decay")
    assert [step for step, _ in lrs] == [4, 8, 12, 16]
    assert tensorboard_series(cfg.save_dir, "lr/no_decay") == lrs
    # TensorBoard keeps float32.
    assert lrs[1][1] == pytest.approx(1e-3, rel=1e-6)


def _events(save_dir):
    module = need("tensorboard.backend.event_processing.event_accumulator")
    accumulator = module.EventAccumulator(os.path.join(str(save_dir), "tensorboard"))
    accumulator.Reload()
    return accumulator


def _hparams_view(save_dir) -> tuple:
    """``({hyper-parameter: value}, [metric tags])`` as the HPARAMS view reads them."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = _events(save_dir).PluginTagToContent("hparams")
    read = plugin_data_pb2.HParamsPluginData.FromString
    start = read(content["_hparams_/session_start_info"]).session_start_info
    experiment = read(content["_hparams_/experiment"]).experiment
    values = {}
    for name, value in start.hparams.items():
        values[name] = getattr(value, value.WhichOneof("kind"))
    return values, [info.name.tag for info in experiment.metric_infos]


def test_learning_rates_of_unnamed_groups_keep_their_index(make_cfg):
    need("tensorboard")
    # Without weight decay adamw makes one group, and names none.
    cfg = make_cfg(logger_name=["tensorboard"], log_every=2)
    Trainer(0, cfg).fit()
    assert [step for step, _ in tensorboard_series(cfg.save_dir, "train/lr_0")] == [2, 4, 6, 8]
    assert not [tag for tag in _events(cfg.save_dir).Tags()["scalars"] if tag.startswith("lr/")]


def test_the_hparams_view_holds_what_the_run_trained_with_and_its_score(make_cfg):
    need("tensorboard")
    cfg = make_cfg(logger_name=["tensorboard"])
    cfg.optimizer_params.lr = 0.02
    cfg.criterion_params.dict_of_loss_params.ce.loss_params = {"src_name": "logits"}
    cfg.project_api_token = "do-not-show"
    Trainer(0, cfg).fit()
    values, metrics = _hparams_view(cfg.save_dir)
    assert values["optimizer_params.lr"] == pytest.approx(0.02)
    assert values["model_name"] == "tests.toy.model"
    assert values["criterion_params.dict_of_loss_params.ce.loss_params.src_name"] == "logits"
    assert values["max_epochs"] == 2 and values["train_ds_params.bs"] == 16
    # Where and under which name it ran is no hyper-parameter; a secret is never shown.
    assert "save_dir" not in values and "name" not in values
    assert values["project_api_token"] == "<redacted>"
    # The score and the metrics, whose scalars the view sets beside them.
    assert metrics == ["valid/acc", "train/loss_avg"]
    assert tensorboard_series(cfg.save_dir, "valid/acc")


def _state(task) -> list:
    """The model's weights and buffers (BatchNorm's running statistics)."""
    return [t.detach().clone() for t in task.model.state_dict().values()]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_state(a), _state(b)))


def _norm_cfg(make_cfg, save_dir, logger_name):
    # prep_batch and dropout draw random numbers; BatchNorm updates its statistics.
    return make_cfg(
        save_dir=str(save_dir),
        logger_name=logger_name,
        model_name="tests.toy.norm_model",
        main_runner="tests.toy.noisy_trainer",
    )


def test_the_graph_is_drawn_beside_the_run_and_changes_nothing(make_cfg, tmp_path):
    need("tensorboard")
    drawn = NoisyTrainer(0, _norm_cfg(make_cfg, tmp_path / "drawn", ["tensorboard"])).fit()
    graph = _events(tmp_path / "drawn").Graph()
    names = [node.name for node in graph.node]
    assert any("BatchNorm1d" in name for name in names) and any("Linear" in name for name in names)
    plain = NoisyTrainer(0, _norm_cfg(make_cfg, tmp_path / "plain", [])).fit()
    assert _same(drawn, plain)


def test_a_graph_drawn_with_the_random_streams_used_would_change_the_run(
    make_cfg, tmp_path, monkeypatch
):
    """The negative control: the comparison above fails when prep_batch's noise for the
    traced batch comes out of the run's random stream."""
    need("tensorboard")
    plain = NoisyTrainer(0, _norm_cfg(make_cfg, tmp_path / "plain", [])).fit()
    monkeypatch.setattr(model_graph, "random_streams_kept", lambda *_: contextlib.nullcontext())
    drawn = NoisyTrainer(0, _norm_cfg(make_cfg, tmp_path / "drawn", ["tensorboard"])).fit()
    assert not _same(drawn, plain)


def test_a_model_that_cannot_be_traced_trains_and_says_so_once(make_cfg):
    need("tensorboard")
    cfg = make_cfg(logger_name=["tensorboard"], model_name="tests.toy.untraceable_model")
    with pytest.warns(UserWarning, match="the model's graph is not drawn") as caught:
        task = Trainer(0, cfg).fit()
    assert len([w for w in caught if "graph is not drawn" in str(w.message)]) == 1
    assert task.engines["trainer"].state.epoch == 2
    assert not _events(cfg.save_dir).Tags()["graph"]
    assert tensorboard_series(cfg.save_dir, "valid/acc")
