"""The mlflow backend against a real local MLflow store, read back with MlflowClient."""

import pytest

from gatle_ignite.callbacks.backends.mlflow import Backend
from gatle_ignite.callbacks.run_record import REDACTED
from tests.backend_fixtures import mlflow_run, mlflow_series, synthetic_cfg, train, use_mlflow_store


def test_a_run_records_its_params_its_metrics_at_their_steps_and_finishes(tmp_path, monkeypatch):
    uri = use_mlflow_store(tmp_path, monkeypatch)
    cfg = synthetic_cfg(tmp_path / "run", ["mlflow"])
    cfg.hub_token = "hf_not_a_real_token"
    cfg.password = "not-a-real-password"
    cfg.data_roots = ["https://user:not-a-real-pw@data.invalid/x"]
    train(cfg)

    client, run = mlflow_run(uri, "gatle-synthetic", cfg.name)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["name"] == "synthetic_v0"
    assert params["max_epochs"] == "2"
    assert params["train_ds_params.n"] == "512"
    assert params["optimizer_params.lr"] == "0.001"
    assert params["logger_name"] == '["mlflow"]'
    assert params["hub_token"] == params["password"] == REDACTED
    assert params["data_roots"] == '["https://<redacted>@data.invalid/x"]'
    assert not [value for value in params.values() if "not-a-real" in value]

    acc = mlflow_series(client, run, "valid/acc")
    assert [step for step, _ in acc] == [8, 16]
    assert all(0.0 <= value <= 1.0 for _, value in acc)
    lrs = mlflow_series(client, run, "train/lr_0")
    assert [step for step, _ in lrs] == [4, 8, 12, 16]
    assert lrs[1][1] == pytest.approx(1e-3)


def test_odd_metric_names_are_made_legal_and_lists_are_left_out(make_cfg, tmp_path, monkeypatch):
    uri = use_mlflow_store(tmp_path, monkeypatch)
    cfg = make_cfg()
    backend = Backend(cfg)
    backend.log({"valid/acc@1": 0.5, "valid/cm": [1, 2]}, epoch=3)
    backend.finish(failed=True)

    client, run = mlflow_run(uri, cfg.project_name, cfg.name)
    assert run.info.status == "FAILED"
    assert run.data.metrics == {"valid/acc_1": 0.5}
    assert mlflow_series(client, run, "valid/acc_1") == [(3, 0.5)]
