"""BaseTrainer behaviour: construction, engines, metrics, eval context, progress, hooks."""

import contextlib
import re
from dataclasses import replace

import pytest
import torch
from ignite.engine import Events

from gatle_ignite import BaseTrainer, ConfigError, EngineSpec
from tests.toy.trainer import Trainer


def test_construction_builds_nothing_and_seeds_the_weights(make_cfg):
    cfg = make_cfg()
    task = BaseTrainer(0, cfg)
    assert task.model is None and task.engines == {} and task._built is False
    assert (task.dtype, task.autocast_enabled, task.device_type) == (torch.float32, False, "cpu")
    first = Trainer(0, cfg).setup().model.state_dict()
    second = Trainer(0, cfg).setup().model.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_prep_batch_must_be_implemented(make_cfg):
    with pytest.raises(NotImplementedError, match="BaseTrainer must implement prep_batch"):
        BaseTrainer(0, make_cfg()).prep_batch(None)


def test_fit_trains_and_reports_namespaced_metrics(make_cfg, capsys):
    task = Trainer(0, make_cfg(max_epochs=3, optimizer_params={"lr": 3e-2}))
    task.fit()
    train = task.engines["trainer"].state.metrics
    assert set(train) == {"train/loss_avg", "train/loss_ce_avg"}
    assert train["train/loss_avg"] == pytest.approx(train["train/loss_ce_avg"])
    assert 0.0 <= task.engines["evaluator"].state.metrics["valid/acc"] <= 1.0
    assert task.engines["tester"] is None
    out = capsys.readouterr().out
    assert "MODEL: 195 trainable parameters" in out
    assert "TRAINING COMPLETE after 3 epochs" in out


def test_progress_lines_have_the_contract_shape(make_cfg, capsys):
    Trainer(0, make_cfg(max_epochs=1, train_ds_params={"n": 160, "bs": 16})).fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if " TRAIN " in line]
    pattern = (
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] TRAIN epoch 1: (\d+)/10 \(\d+%\) \| "
        r"loss [\d.e+-]+ \| [\d.]+k? it/s, [\d.]+k? samples/s \| elapsed \d+:\d\d:\d\d \| "
        r"ETA epoch \d+:\d\d:\d\d, run \d+:\d\d:\d\d"
    )
    done = [int(re.fullmatch(pattern, line).group(1)) for line in lines]
    assert done == list(range(1, 11))


def test_each_progress_line_is_one_write(make_cfg, count_stdout_writes):
    # Unbuffered (PYTHONUNBUFFERED), every write is a system call: print() would make two.
    task = Trainer(0, make_cfg(max_epochs=1, every_val=0, train_ds_params={"n": 160, "bs": 16}))
    writes = count_stdout_writes()
    task.fit()
    progress = [text for text in writes if " TRAIN epoch 1: " in text]
    assert len(progress) == 10 and all(text.count("\n") == 1 for text in progress)


def test_progress_follows_the_global_iteration_cadence_across_epochs(make_cfg, capsys):
    # 25 iterations per epoch -> a line every 2 iterations, counted over the whole run as an
    # ignite every= filter counts: epoch 2 reports 1/25 (iteration 26), 3/25, ...
    cfg = make_cfg(max_epochs=2, every_val=0, train_ds_params={"n": 400, "bs": 16})
    Trainer(0, cfg).fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if " TRAIN " in line]
    pattern = r"\[[^]]+\] TRAIN epoch (\d): (\d+)/25 \((\d+)%\) \| .*"
    matches = (re.fullmatch(pattern, line).groups() for line in lines)
    seen = [(epoch, pct, done) for epoch, done, pct in matches]
    assert seen[:2] == [("1", "8", "2"), ("1", "16", "4")]
    assert [done for epoch, _, done in seen if epoch == "2"][:2] == ["1", "3"]
    assert len(seen) == 25


def test_eval_progress_uses_the_specs_cadence(make_cfg, capsys):
    class SparseProgress(Trainer):
        def eval_specs(self):
            return (replace(super().eval_specs()[0], progress_every=2),)

    SparseProgress(0, make_cfg(max_epochs=1, valid_ds_params={"n": 96, "bs": 16})).fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if " VALID " in line]
    assert [line.split(": ")[1].split(" ")[0] for line in lines] == ["2/6", "4/6", "6/6"]


def test_an_eval_run_shorter_than_its_cadence_gets_no_printer(make_cfg, capsys):
    # 2 valid batches, progress_every 100: no line could ever print, so nothing is attached
    # that would run on every batch.
    task = Trainer(0, make_cfg(max_epochs=1)).fit()
    handlers = task.engines["evaluator"]._event_handlers[Events.ITERATION_COMPLETED]
    assert len(handlers) == 1  # the accuracy metric
    assert " VALID " not in capsys.readouterr().out


def test_a_progress_cadence_below_one_is_refused(make_cfg):
    class NoProgress(Trainer):
        def eval_specs(self):
            return (replace(super().eval_specs()[0], progress_every=0),)

    with pytest.raises(ValueError, match="every must be a positive integer"):
        NoProgress(0, make_cfg(max_epochs=1)).fit()


def test_the_text_backend_prints_epoch_metrics(make_cfg, capsys):
    Trainer(0, make_cfg(max_epochs=1, logger_name=["text"])).fit()
    out = capsys.readouterr().out
    assert "--- epoch 1/1 (iteration 4) ---" in out
    assert "\ntrain  loss_avg " in out and "\nvalid  acc " in out


def test_a_model_input_key_the_model_lacks_is_a_type_error(make_cfg):
    class Wrong(Trainer):
        def prep_batch(self, batch, split="train", **kwargs):
            x, y = batch
            return {"model_input": {"inputs": x}, "targets": {"labels": y}}

    with pytest.raises(TypeError):
        Wrong(0, make_cfg(max_epochs=1)).fit()


def test_prep_batch_sees_each_engines_split(make_cfg):
    seen = set()

    class Recording(Trainer):
        def prep_batch(self, batch, split="train", **kwargs):
            seen.add(split)
            return super().prep_batch(batch, split=split)

    cfg = make_cfg(
        max_epochs=1,
        every_test=1,
        test_ds_name="tests.toy.data",
        test_ds_params={"n": 16, "bs": 16},
        tester_metrics={"acc": {"cls_name": "tests.toy.metric"}},
    )
    task = Recording(0, cfg)
    task.fit()
    assert seen == {"train", "valid", "test"}
    assert "test/acc" in task.engines["tester"].state.metrics


def test_a_declared_engine_runs_on_its_cadence_and_is_checkpointed(make_cfg, tmp_path):
    class WithProbe(Trainer):
        def eval_specs(self):
            return super().eval_specs() + (EngineSpec.for_split("probe"),)

    cfg = make_cfg(
        max_epochs=4,
        n_saved=None,
        probe_ds_name="tests.toy.data",
        probe_ds_params={"n": 16, "bs": 16},
        probe_metrics={"acc": {"cls_name": "tests.toy.metric"}},
        every_probe=2,
        probe_score_name="probe/acc",
    )
    runs = []
    task = WithProbe(0, cfg).setup()
    task.engines["probe"].add_event_handler(
        Events.COMPLETED, lambda engine: runs.append(task.engines["trainer"].state.epoch)
    )
    task.fit()
    assert runs == [2, 4]
    assert sorted(p.name.split("_")[-2] for p in (tmp_path / "run").glob("probe_best*")) == [
        "2",
        "4",
    ]


def test_a_declared_engine_without_its_cadence_field_is_refused(make_cfg):
    class WithProbe(Trainer):
        def eval_specs(self):
            return super().eval_specs() + (EngineSpec.for_split("probe"),)

    cfg = make_cfg(probe_ds_name="tests.toy.data")
    with pytest.raises(ConfigError, match="every_probe"):
        WithProbe(0, cfg).setup()


@pytest.mark.parametrize("attr", ["key", "engine_type"])
def test_duplicate_engine_specs_are_refused(make_cfg, attr):
    first = EngineSpec.for_split("probe")
    second = replace(first, **({"engine_type": "other"} if attr == "key" else {"key": "other"}))

    class Twice(Trainer):
        def eval_specs(self):
            return super().eval_specs() + (first, second)

    with pytest.raises(ConfigError, match=f"more than one engine with {attr}"):
        Twice(0, make_cfg()).setup()


def test_total_loss_false_keeps_only_the_components(make_cfg):
    class Components(Trainer):
        def train_spec(self):
            return replace(super().train_spec(), total_loss=False)

    task = Components(0, make_cfg(max_epochs=1))
    task.fit()
    assert set(task.engines["trainer"].state.metrics) == {"train/loss_ce_avg"}


def test_with_losses_false_still_trains(make_cfg):
    class NoLosses(Trainer):
        def train_spec(self):
            return replace(super().train_spec(), with_losses=False)

    task = NoLosses(0, make_cfg(max_epochs=1, every_val=0))
    task.setup()
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    task.fit()
    assert task.engines["trainer"].state.metrics == {}
    assert any(not torch.equal(before[k], v) for k, v in task.model.state_dict().items())


def test_eval_context_wraps_only_the_eval_run_and_best_stores_live_weights(make_cfg, tmp_path):
    class Swapping(Trainer):
        inside = []

        @contextlib.contextmanager
        def eval_context(self, spec):
            live = {k: v.clone() for k, v in self.model.state_dict().items()}
            with torch.no_grad():
                for p in self.model.parameters():
                    p.zero_()
            self.inside.append(spec.key)
            try:
                yield
            finally:
                self.model.load_state_dict(live)

    task = Swapping(0, make_cfg(max_epochs=1))
    task.fit()
    assert Swapping.inside == ["evaluator"]
    best = next((tmp_path / "run").glob("valid_best*"))
    saved = torch.load(best, weights_only=True)["model"]
    assert all(torch.equal(saved[k], v) for k, v in task.model.state_dict().items())
    assert any(saved[k].abs().sum() > 0 for k in saved)


def test_a_failed_evaluation_selects_no_checkpoint_and_restores_the_context(make_cfg, tmp_path):
    restored = []

    class Failing(Trainer):
        @contextlib.contextmanager
        def eval_context(self, spec):
            try:
                yield
            finally:
                restored.append(spec.key)

        def eval_step(self, engine, batch, split="valid"):
            raise RuntimeError("eval broke")

    with pytest.raises(RuntimeError, match="eval broke"):
        Failing(0, make_cfg(max_epochs=1)).fit()
    assert restored == ["evaluator"]
    assert not list((tmp_path / "run").glob("valid_best*")) if (tmp_path / "run").exists() else True


def test_a_crash_in_training_finishes_every_backend_as_failed(make_cfg):
    task = Trainer(0, make_cfg(max_epochs=1, logger_name=["tests.toy.recording_backend"]))
    task.setup()

    def boom(engine, batch):
        raise RuntimeError("step broke")

    task.engines["trainer"]._process_function = boom
    with pytest.raises(RuntimeError, match="step broke"):
        task.fit()
    from tests.toy.recording_backend import FINISHED

    assert FINISHED[-1] is True


def test_a_distributed_sampler_gets_the_epoch(make_cfg):
    epochs = []

    class Sampler(torch.utils.data.Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n))

        def __len__(self):
            return self.n

        def set_epoch(self, epoch):
            epochs.append(epoch)

    task = Trainer(0, make_cfg(max_epochs=3, every_val=0))
    task.setup()
    dataset = task.dls["train"].dataset
    task.dls["train"] = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=Sampler(64))
    task.fit()
    assert epochs == [1, 2, 3]


def test_dict_metric_from_list_refuses_bad_specs(make_cfg):
    task = BaseTrainer(0, make_cfg())
    assert task.dict_metric_from_list("valid", {}, {"x": 1}) == {"x": 1}
    with pytest.raises(ConfigError, match="dict_metric_from_list"):
        task.dict_metric_from_list("valid", ["acc"], {})
    with pytest.raises(ConfigError, match="metric entry 'acc' is missing 'cls_name'"):
        task.dict_metric_from_list("valid", {"acc": {"params": {}}}, {})
    with pytest.raises(ConfigError, match="valid_metrics.acc.cls_name"):
        task.dict_metric_from_list("valid", {"acc": {"cls_name": "tests.toy.model"}}, {})
    built = task.dict_metric_from_list("valid", {"acc": {"cls_name": "tests.toy.metric"}}, {})
    assert list(built) == ["valid/acc"]


def test_build_optimizer_works_on_its_own_and_names_the_field(make_cfg):
    task = BaseTrainer(0, make_cfg(optimizer_name="tests.toy.model"))
    from tests.toy.model import Model

    task.model = Model()
    with pytest.raises(ConfigError, match="must expose 'get_optimizer'") as info:
        task.build_optimizer()
    assert "optimizer_name" in str(info.value) and "Model" in str(info.value)


def test_an_untrained_evaluation_reproduces_the_initial_weights(make_cfg):
    cfg = make_cfg()
    cfg.run = True
    first = Trainer(0, cfg)
    first.evaluate(load_checkpoint=False)
    fresh = Trainer(0, make_cfg()).setup()
    assert all(
        torch.equal(fresh.model.state_dict()[k], v) for k, v in first.model.state_dict().items()
    )
    assert first.dls["valid"] is not None and first.engines["trainer"].state.epoch == 0


def test_a_misspelt_model_param_names_the_field_and_is_still_a_type_error(make_cfg):
    with pytest.raises(
        ConfigError, match="model_params not accepted by tests.toy.model.Model"
    ) as info:
        Trainer(0, make_cfg(model_params={"hiden": 4})).setup()
    assert isinstance(info.value, TypeError) and "hiden" in str(info.value)


def test_a_missing_warm_start_file_is_a_config_error(make_cfg, tmp_path):
    cfg = make_cfg(model_checkpoint_dir=str(tmp_path / "nope.pt"))
    with pytest.raises(ConfigError, match="is not a file"):
        Trainer(0, cfg).fit()


def test_loss_averages_match_ignite_average_for_scalar_and_per_sample_losses(make_cfg):
    from ignite.metrics import Average

    seen = {"loss": [], "loss_ce": []}

    class PerSample(Trainer):
        def train_step(self, engine, batch, split="train"):
            output = super().train_step(engine, batch, split)
            # The total stays a scalar; the component becomes one value per sample, (N, 1).
            column = output["losses"]["loss_ce"].detach().expand(len(batch[0]), 1).clone()
            column[0] += engine.state.iteration
            output["losses"]["loss_ce"] = column
            seen["loss"].append(output["losses"]["loss"].detach().clone())
            seen["loss_ce"].append(column)
            return output

    task = PerSample(0, make_cfg(max_epochs=1, every_val=0))
    task.fit()
    metrics = task.engines["trainer"].state.metrics
    for key, values in seen.items():
        reference = Average()
        for value in values:
            reference.update(value)
        expected = torch.as_tensor(reference.compute(), dtype=torch.float64)
        assert torch.allclose(torch.as_tensor(metrics[f"train/{key}_avg"]).double(), expected)


def _finite_until(iteration, last, bad):
    return 1.0 if iteration <= last else float(bad)


@pytest.mark.parametrize(
    ("losses", "stops_at"),
    [
        # The total is finite, a component is not: each distinct tensor is checked.
        (lambda i: {"loss": torch.tensor(1.0), "loss_aux": torch.tensor(float("nan"))}, 1),
        # A one-term total is its term (one tensor, checked once); inf stops as NaN does.
        (lambda i: dict.fromkeys(("loss", "loss_ce"), torch.tensor(_finite_until(i, 2, "inf"))), 3),
        # Plain numbers and per-sample tensors are checked too.
        (lambda i: {"loss": 1.0, "loss_px": torch.tensor([1.0, _finite_until(i, 1, "nan")])}, 2),
        (lambda i: {"loss": torch.tensor(0.5, requires_grad=True) * 2}, None),
    ],
)
@pytest.mark.parametrize("every", [1, 8])
def test_the_nan_check_stops_at_the_first_non_finite_loss(losses, stops_at, every):
    from ignite.engine import Engine

    from gatle_ignite.trainer.handlers import NonFiniteCheck

    engine = Engine(lambda e, batch: {"losses": losses(e.state.iteration)})
    check = NonFiniteCheck(every=every)
    check.attach(engine)
    engine.run(range(5), max_epochs=1)
    assert check.first_bad == stops_at
    if every == 1:
        assert engine.state.iteration == (stops_at or 5)
    else:
        # Read at the epoch's end: the run stops there, naming the first bad iteration.
        assert engine.state.iteration == 5


def test_setup_builds_a_task_whose_score_its_metrics_do_not_give_and_fit_refuses_it(make_cfg):
    # A 0.4 script builds a task to inspect it without evaluating (CONTRACT 6.4): setup() only
    # builds; the score is checked where it is used, by fit() (and by config and train before).
    task = Trainer(0, make_cfg(score_name="valid/flat")).setup()
    assert task.model is not None and task.engines["evaluator"] is not None
    with pytest.raises(ConfigError, match=r"cfg.score_name = 'valid/flat', but the 'evaluator'"):
        task.fit()
    assert task.engines["trainer"].state.iteration == 0
