"""The copy-paste templates (EXAMPLES 10): each through its contract, then all trained together."""

import csv
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ignite.engine import Engine, Events
from ignite.metrics import Metric
from torch import nn
from torch.utils.data import Sampler, TensorDataset

from examples.templates.scripts import checks
from gatle_ignite import BaseTrainer, base_config, build_dataloader, get_dataset
from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.callbacks.logging import LoggingCallback
from gatle_ignite.cli.main import main
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import CONTRACTS, import_entrypoint
from gatle_ignite.losses.composite import Loss as Composite
from gatle_ignite.schedulers import attach_scheduler, prep_scheduler
from tests.conftest import HANG_S

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "examples.templates"
CONFIG = ROOT / "examples" / "templates" / "configs" / "templates_v0.py"
TARGETS = {"src_name": "logits", "tgt_name": ("targets", "labels")}


def entry(module, name):
    return import_entrypoint(f"{PACKAGE}.{module}", name, field=module)


@pytest.fixture
def cfg(tmp_path):
    """The all-together config, writing into ``tmp_path``."""
    config = load_config_from_file(str(CONFIG))
    config.save_dir = str(tmp_path / "run")
    return config


def step_output(logits, labels):
    return {"y_pred": {"logits": logits}, "target": {"targets": {"labels": labels}}}


def test_one_template_per_entrypoint():
    assert sorted(name for _, name in checks.ENTRYPOINTS) == sorted(row[1] for row in CONTRACTS)
    for module, name in checks.ENTRYPOINTS:
        assert callable(entry(module, name))


# ----------------------------------------------------------------------------- each contract


def test_trainer(cfg):
    Trainer = entry("trainer", "Trainer")
    task = Trainer(0, cfg)
    assert isinstance(task, BaseTrainer)
    assert [spec.key for spec in task.eval_specs()] == ["evaluator", "tester", "probe"]
    batch = (torch.zeros(2, 64), torch.tensor([1, 2]))
    prepared = task.prep_batch(batch, split="train")
    assert set(prepared) == {"model_input", "targets"}
    assert prepared["targets"]["labels"].tolist() == [1, 2]


def test_trainer_backward_scales_backbone_gradients_on_stepping_batches(cfg):
    task = entry("trainer", "Trainer")(0, cfg)
    task.model = entry("model", "Model")(**cfg.model_params)
    steps = []
    task.optimizer = type("Recorder", (), {"step": lambda self: steps.append(1)})()
    x = torch.randn(4, 64)

    def grads(scaled, step):
        task.model.zero_grad()
        loss = task.model(x)["logits"].square().mean()
        if scaled:
            task.backward(loss, step=step)
        else:
            loss.backward()
        return {n: p.grad.clone() for n, p in task.model.named_parameters()}

    plain = grads(scaled=False, step=True)
    accumulating = grads(scaled=True, step=False)
    assert steps == []
    for name in plain:
        assert torch.allclose(accumulating[name], plain[name]), name
    stepped = grads(scaled=True, step=True)
    assert steps == [1]
    for name in plain:
        factor = 0.1 if name.startswith("backbone.") else 1.0
        assert torch.allclose(stepped[name], plain[name] * factor), name


def test_model():
    model = entry("model", "Model")(**{"in_dim": 64, "hidden": 128, "n_classes": 10})
    assert isinstance(model, nn.Module)
    out = model(torch.zeros(3, 64))
    assert set(out) == {"logits"} and out["logits"].shape == (3, 10)
    with pytest.raises(TypeError):
        entry("model", "Model")(hidden_dim=4)


def test_dataset_through_get_dataset():
    loader, info = get_dataset(f"{PACKAGE}.dataset", {"n": 10, "bs": 4, "seed": 3}, None)
    assert info == {"length": 10, "num_classes": 10}
    x, y = next(iter(loader))
    assert x.shape == (4, 64) and y.shape == (4,)
    assert torch.equal(
        loader.dataset.labels, entry("dataset", "MyDataset")("data", "valid", 10, 3).labels
    )


def test_dataset_only_augments_train():
    def shift(x):
        return x + 100.0

    get_ds = entry("dataset", "get_ds")
    for split in ("train", "valid", "probe"):
        clean, _ = get_ds({"split": split, "n": 6, "bs": 6, "seed": 1})
        shifted, _ = get_ds({"split": split, "n": 6, "bs": 6, "seed": 1}, transform=shift)
        (x_clean, y_clean), (x_shifted, y_shifted) = next(iter(clean)), next(iter(shifted))
        assert torch.equal(y_clean, y_shifted)
        expected = x_clean + 100.0 if split == "train" else x_clean
        assert torch.equal(x_shifted, expected), split


def test_dataset_splits_share_the_labelling_function():
    MyDataset = entry("dataset", "MyDataset")
    weights = torch.randn(64, 10, generator=torch.Generator().manual_seed(1234))
    splits = [MyDataset("data", "train", 64, seed=0), MyDataset("data", "valid", 64, seed=1)]
    assert not torch.equal(splits[0].x, splits[1].x)
    for dataset in splits:
        assert torch.equal(dataset.labels, (dataset.x @ weights).argmax(dim=1))


def test_augmentation():
    Transformation = entry("augmentation", "Transformation")
    x = torch.zeros(1000)
    assert torch.equal(Transformation(**{"p": 0.0, "scale": 1.0})(x), x)
    noisy = Transformation(**{"p": 1.0, "scale": 0.1})(x)
    assert 0.05 < float(noisy.std()) < 0.15
    torch.manual_seed(0)
    applied = sum(not torch.equal(Transformation(p=0.5)(x), x) for _ in range(400))
    assert 150 < applied < 250


def test_loss_is_a_bare_tensor_and_gamma_zero_is_cross_entropy():
    Loss = entry("loss", "Loss")
    logits, labels = torch.randn(8, 10), torch.randint(0, 10, (8,))
    y_pred, target = {"logits": logits}, {"targets": {"labels": labels}}
    focal = Loss(**TARGETS)(y_pred, target, 1)
    assert isinstance(focal, torch.Tensor) and focal.dim() == 0
    ce = Loss(**TARGETS, gamma=0.0)(y_pred, target)
    assert torch.allclose(ce, nn.functional.cross_entropy(logits, labels))
    assert float(focal) < float(ce)


def test_loss_inside_the_composite(cfg):
    composite = Composite(**cfg.criterion_params)
    assert composite.crit_keys == ["ce", "focal"]
    output = step_output(torch.randn(4, 10), torch.tensor([0, 1, 2, 3]))
    total, parts = composite(output["y_pred"], output["target"], iteration=1)
    assert set(parts) == {"loss_ce", "loss_focal"}
    assert torch.allclose(total, parts["loss_ce"] + parts["loss_focal"])


def test_optimizer_groups():
    get_optimizer = entry("optimizer", "get_optimizer")
    model = entry("model", "Model")()
    optimizer = get_optimizer(model, **{"lr": 1e-3, "weight_decay": 0.01})
    assert isinstance(optimizer, torch.optim.AdamW)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and len(decay["params"]) == 2
    assert all(p.ndim == 1 for p in no_decay["params"]) and len(no_decay["params"]) == 2
    single = get_optimizer(model, weight_decay=0.01, no_decay_on_norm_and_bias=False)
    assert len(single.param_groups) == 1 and single.param_groups[0]["weight_decay"] == 0.01
    assert get_optimizer(model, betas=(0.8, 0.9)).param_groups[0]["betas"] == (0.8, 0.9)


def test_scheduler_through_prep_and_attach(cfg):
    model = entry("model", "Model")()
    optimizer = entry("optimizer", "get_optimizer")(model, lr=1e-3)
    engines = {"trainer": Engine(lambda e, b: None), "evaluator": None}
    scheduler, engine_name, event = prep_scheduler(
        cfg.lr_scheduler, cfg, list(range(4)), optimizer, engines
    )
    assert (engine_name, event) == ("trainer", Events.EPOCH_COMPLETED)
    assert attach_scheduler(scheduler, engine_name, event, engines) is scheduler
    lrs = []
    for _ in range(3):
        scheduler(None)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([1e-3, 5e-4, 2.5e-4])


def test_scheduler_defaults():
    get_scheduler = entry("scheduler", "get_scheduler")
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler, _, _ = get_scheduler(base_config(), [0], optimizer, {})
    lrs = []
    for _ in range(7):
        scheduler(None)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([1.0] * 5 + [0.1] * 2)


def test_metric_reduces_rather_than_lies():
    metric = entry("metric", "get_metric")("valid", {}, **TARGETS, k=2)
    assert isinstance(metric, Metric)
    assert hasattr(type(metric).compute, "__wrapped__")
    metric.reset()
    for name in type(metric)._state_dict_all_req_keys:
        assert isinstance(getattr(metric, name), torch.Tensor), name


SHARDED_METRIC = """
import sys
from pathlib import Path

import ignite.distributed as idist
import torch

from examples.templates.metric import get_metric


def score_shard(local_rank, out_dir):
    metric = get_metric("valid", {}, k=1)
    metric.reset()
    # Rank 0 gets two hits, rank 1 two misses: only the all-reduced count gives 0.5.
    labels = torch.tensor([0, 1]) if idist.get_rank() == 0 else torch.tensor([2, 2])
    metric.update((torch.eye(3)[:2], labels))
    Path(out_dir, f"rank{idist.get_rank()}.txt").write_text(str(metric.compute()))


if __name__ == "__main__":
    port = int(sys.argv[2])
    with idist.Parallel(backend="gloo", nproc_per_node=2, master_port=port) as parallel:
        parallel.run(score_shard, sys.argv[1])
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_metric_reduces_across_two_gloo_ranks(tmp_path):
    script = tmp_path / "sharded_metric.py"
    script.write_text(SHARDED_METRIC)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    assert [float((tmp_path / f"rank{r}.txt").read_text()) for r in (0, 1)] == [0.5, 0.5]


def test_metric_counts_top_k_through_an_engine():
    logits = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [1.0, 3.0, 2.0]])
    labels = torch.tensor([1, 0, 0])
    values = {}
    for k in (1, 2, 3):
        engine = Engine(lambda e, b: step_output(logits, labels))
        entry("metric", "get_metric")("valid", {}, k=k).attach(engine, "topk")
        values[k] = engine.run([0, 1], max_epochs=1).metrics["topk"]
    assert values == pytest.approx({1: 0.0, 2: 1 / 3, 3: 1.0})


def test_sampler_balances_and_falls_back_to_iterating():
    get_sampler = entry("sampler", "get_sampler")
    labels = torch.tensor([0] * 18 + [1] * 2)
    with_labels = entry("dataset", "MyDataset")("data", "train", 20, seed=0)
    with_labels.labels = labels
    plain = TensorDataset(torch.zeros(20, 1), labels)
    for dataset in (with_labels, plain):
        sampler = get_sampler(dataset, num_samples=4000, generator=torch.Generator().manual_seed(1))
        assert isinstance(sampler, Sampler) and len(sampler) == 4000
        share = float((labels[list(sampler)] == 1).float().mean())
        assert 0.45 < share < 0.55
    assert len(get_sampler(plain)) == 20


SEQUENCES = [(torch.tensor([4, 5, 6]), 1), (torch.tensor([7]), 0)]


@pytest.mark.parametrize(("params", "pad"), [({"params": {"pad_id": -1}}, -1), ({}, 0)])
def test_collate_by_dotted_path(params, pad):
    collate_fn = {"cls_name": f"{PACKAGE}.collate", **params}
    batch = next(iter(build_dataloader(SEQUENCES, {"bs": 2, "collate_fn": collate_fn})))
    assert set(batch) == {"x", "lengths", "y"}
    assert batch["x"].tolist() == [[4, 5, 6], [7, pad, pad]]
    assert batch["lengths"].tolist() == [3, 1]
    assert batch["y"].tolist() == [1, 0]


def test_collate_direct_call():
    collate = entry("collate", "get_collate_fn")(**{"pad_id": 9})
    assert collate(SEQUENCES)["x"].tolist() == [[4, 5, 6], [7, 9, 9]]


def test_backend_through_logger_name(tmp_path):
    cfg = base_config()
    cfg.name = "custom"
    cfg.save_dir = str(tmp_path)
    cfg.logger_name = ["pbar", f"{PACKAGE}.backend"]
    callback = LoggingCallback(cfg).start()
    assert len(callback.backends) == 1
    assert isinstance(callback.backends[0], BaseBackend)
    callback._log({"train/loss": 0.5}, step=1, epoch=1)
    callback.finish()
    with (tmp_path / "custom_metrics.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1
    assert rows[0]["train/loss"] == "0.5" and rows[0]["epoch"] == "1"


def test_backend_header_is_fixed_by_the_first_row_and_survives_a_resume(tmp_path):
    cfg = base_config()
    cfg.name = "run"
    cfg.save_dir = str(tmp_path / "new")
    Backend = entry("backend", "Backend")
    backend = Backend(cfg)
    backend.log({"train/loss": 1.0}, epoch=1)
    backend.log({"train/loss": 0.5, "valid/acc": 0.9}, step=7)
    backend.watch(nn.Linear(1, 1))
    backend.finish(failed=True)
    Backend(cfg).log({"train/loss": 0.25}, epoch=2)
    lines = (tmp_path / "new" / "run_metrics.csv").read_text().splitlines()
    assert lines == ["step,epoch,train/loss", ",1,1.0", "7,,0.5", ",2,0.25"]


# ----------------------------------------------------------------------------- all together


def test_config_passes_the_preflight(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["config", "--config=examples/templates/configs/templates_v0.py"]) == 0
    assert "all dotted paths resolve" in capsys.readouterr().out


def test_all_templates_train_together(cfg):
    task, history = checks.train(cfg)
    assert len(history["trainer"]) == 2
    top2 = history["evaluator"][-1]["valid/top2"]
    assert 0 < top2 <= 1
    assert "probe/top2" in history["probe"][-1]
    assert "train/loss_focal_avg" in history["trainer"][-1]
    for group in task.optimizer.param_groups:
        assert math.isclose(group["lr"], 1e-3 * 0.5 ** (2 - 1), rel_tol=1e-9)
    assert list(Path(cfg.save_dir).glob("valid_best_result_checkpoint_2_*.pt"))


def test_checks_script_passes(tmp_path, capsys):
    assert checks.main(["--save-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert out.rstrip().endswith(" passed, 0 failed")
