"""What every backend shares: the same values, failure recorded and everything closed, rank 0
only, the run record (config.json, redaction), lazy imports and the missing-package error."""

import json
import os
import subprocess
import sys

import pytest

from gatle_ignite import ConfigError
from gatle_ignite.callbacks import logging as logging_module
from gatle_ignite.callbacks.logging import Backend, LoggingCallback
from gatle_ignite.callbacks.run_record import REDACTED, config_payload, flat_params
from tests.backend_fixtures import (
    WandbRun,
    Webhook,
    csv_rows,
    csv_series,
    mlflow_run,
    mlflow_series,
    need,
    tensorboard_series,
    use_mlflow_store,
    use_wandb_offline,
)
from tests.conftest import HANG_S
from tests.toy import recording_backend
from tests.toy.trainer import Trainer

RECORDING = "tests.toy.recording_backend"


@pytest.fixture(autouse=True)
def _clear_recordings():
    for store in (recording_backend.LOGGED, recording_backend.WATCHED, recording_backend.FINISHED):
        store.clear()


class CrashingTrainer(Trainer):
    """The toy task (4 iterations an epoch), dying at iteration 6: the middle of epoch 2."""

    def prep_batch(self, batch, split="train", **kwargs):
        if split == "train" and self.engines["trainer"].state.iteration == 6:
            raise RuntimeError("boom in the middle of epoch 2")
        return super().prep_batch(batch, split=split, **kwargs)


def test_four_backends_at_once_hold_the_same_history(make_cfg, tmp_path, monkeypatch):
    need("tensorboard")
    wandb_root = use_wandb_offline(tmp_path, monkeypatch)
    uri = use_mlflow_store(tmp_path, monkeypatch)
    cfg = make_cfg(
        max_epochs=2,
        log_every=2,
        watch_grad=True,
        logger_name=["csv", "tensorboard", "mlflow", "wandb"],
    )
    Trainer(0, cfg).fit()

    client, run = mlflow_run(uri, cfg.project_name, cfg.name)
    wandb_run = WandbRun(wandb_root, cfg.name)
    for name, steps in (("valid/acc", [4, 8]), ("train/grad_norm", [2, 4, 6, 8])):
        from_csv = [(step or epoch, value) for epoch, step, value in csv_series(cfg.save_dir, name)]
        assert [step for step, _ in from_csv] == steps
        assert mlflow_series(client, run, name) == from_csv
        from_tensorboard = tensorboard_series(cfg.save_dir, name)
        assert [step for step, _ in from_tensorboard] == steps
        assert [v for _, v in from_tensorboard] == pytest.approx([v for _, v in from_csv])
        assert [v for _, v in wandb_run.series(name)] == [v for _, v in from_csv]
    assert all(value > 0 for _, _, value in csv_series(cfg.save_dir, "train/grad_norm"))
    assert run.info.status == "FINISHED"
    assert wandb_run.exit_code == 0


def test_a_crash_mid_epoch_is_recorded_as_failed_and_closes_every_backend(
    make_cfg, tmp_path, monkeypatch
):
    need("tensorboard")
    need("requests")
    wandb_root = use_wandb_offline(tmp_path, monkeypatch)
    uri = use_mlflow_store(tmp_path, monkeypatch)
    with Webhook() as hook:
        cfg = make_cfg(
            max_epochs=3,
            log_every=2,
            logger_name=["csv", "tensorboard", "mlflow", "wandb", "discord", RECORDING],
            discord_url=hook.url,
        )
        task = CrashingTrainer(0, cfg).setup()
        backends = {type(b).__module__.rsplit(".", 1)[-1]: b for b in task.logger.backends}
        with pytest.raises(RuntimeError, match="boom"):
            task.fit()

    assert task.logger.backends == []
    assert recording_backend.FINISHED == [True]
    assert WandbRun(wandb_root, cfg.name).exit_code == 1
    client, run = mlflow_run(uri, cfg.project_name, cfg.name)
    assert run.info.status == "FAILED"
    assert hook.descriptions[0] == "Run started"
    assert hook.descriptions[-1] == "Run failed"
    # Files closed, whole, and holding what was logged before the crash.
    assert backends["csv"].file.closed
    assert backends["tensorboard"].writer.file_writer is None
    assert all(len(row) == 5 and None not in row.values() for row in csv_rows(cfg.save_dir))
    assert [e for e, _, _ in csv_series(cfg.save_dir, "valid/acc")] == [1]
    assert [s for _, s, _ in csv_series(cfg.save_dir, "train/lr_0")] == [2, 4]
    assert [s for s, _ in tensorboard_series(cfg.save_dir, "valid/acc")] == [4]
    assert [s for s, _ in mlflow_series(client, run, "train/lr_0")] == [2, 4]
    assert os.path.exists(os.path.join(cfg.save_dir, "config.json"))


def test_every_run_writes_its_redacted_config_to_config_json(make_cfg):
    cfg = make_cfg(logger_name=["text"], discord_url="https://discord.invalid/api/webhooks/1/t")
    cfg.optimizer_params = {"lr": 1e-2, "weight_decay": 0.0, "vendor": {"api_key": "sk-abc"}}
    cfg.hub_token = ""
    LoggingCallback(cfg).start().finish()
    with open(os.path.join(cfg.save_dir, "config.json"), encoding="utf-8") as handle:
        written = json.load(handle)
    assert written == config_payload(cfg)
    assert written["discord_url"] == REDACTED
    assert written["optimizer_params"] == {
        "lr": 1e-2,
        "weight_decay": 0.0,
        "vendor": {"api_key": REDACTED},
    }
    # An unset credential is shown as unset.
    assert written["hub_token"] == ""
    assert written["name"] == "toy" and written["logger_name"] == ["text"]
    assert not [name for name in os.listdir(cfg.save_dir) if name.endswith(".partial")]


def test_redaction_reaches_nested_and_listed_fields_and_only_secret_names():
    payload = config_payload(
        {
            "MY_SECRET": "s",
            "keyboard": "kept",
            "groups": [{"auth_token": "t", "lr": 1, "password": "p"}],
            "nested": {"client_secret": "c", "url_base": "kept", "apiKey": "k", "max_tokens": 8},
            "roots": [["https://user:pw@host/a"], {"src": "s3://key@bucket/b"}],
            "wandb_entity": None,
        }
    )
    assert payload == {
        "MY_SECRET": REDACTED,
        "keyboard": "kept",
        "groups": [{"auth_token": REDACTED, "lr": 1, "password": REDACTED}],
        "nested": {
            "client_secret": REDACTED,
            "url_base": "kept",
            "apiKey": REDACTED,
            "max_tokens": 8,
        },
        "roots": [["https://<redacted>@host/a"], {"src": "s3://<redacted>@bucket/b"}],
        "wandb_entity": None,
    }
    assert flat_params({"a": {"b": 1, "c": "x", "d": {}}, "e": [1], "f": None}) == {
        "a.b": "1",
        "a.c": "x",
        "a.d": "{}",
        "e": "[1]",
        "f": "null",
    }


def test_other_ranks_build_nothing_and_write_nothing(make_cfg, monkeypatch):
    monkeypatch.setattr(logging_module.idist, "get_rank", lambda: 1)
    cfg = make_cfg(logger_name=["csv", RECORDING])
    assert LoggingCallback(cfg).start().backends == []
    assert not os.path.exists(cfg.save_dir)


def test_a_text_and_csv_run_imports_no_optional_package(tmp_path):
    code = (
        "import sys; sys.path.insert(0, '.');"
        "from tests.toy.config import toy_config;"
        "from tests.toy.trainer import Trainer;"
        f"cfg = toy_config(save_dir={str(tmp_path)!r}, logger_name=['text', 'csv', 'pbar']);"
        "Trainer(0, cfg).fit();"
        "names = ('wandb', 'requests', 'mlflow', 'tensorboard', 'torch.utils.tensorboard');"
        "print('OPTIONAL', [m for m in names if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=HANG_S
    ).stdout
    assert "OPTIONAL []" in out
    assert os.path.exists(tmp_path / "metrics.csv")


@pytest.mark.parametrize(
    "backend, modules",
    [
        ("wandb", ["wandb"]),
        ("discord", ["requests"]),
        ("tensorboard", ["tensorboard", "torch.utils.tensorboard"]),
        ("mlflow", ["mlflow"]),
    ],
)
def test_a_named_backend_whose_package_is_missing_names_its_extra(
    make_cfg, monkeypatch, backend, modules
):
    # None in sys.modules makes the import fail exactly as an absent package does.
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError, match=rf"gatle-ignite\[{backend}\]") as raised:
        LoggingCallback(make_cfg(logger_name=[backend], discord_url="http://127.0.0.1:9/x")).start()
    assert "logger_name" in str(raised.value)


def test_a_backend_that_fails_to_build_closes_the_ones_built_before_it(make_cfg, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="wandb"):
        LoggingCallback(make_cfg(logger_name=[RECORDING, "wandb"])).start()
    assert recording_backend.FINISHED == [True]


class _Broken(Backend):
    def finish(self, failed=False):
        raise OSError("disk gone")


def test_finish_reaches_every_backend_even_past_one_that_raises(make_cfg):
    cfg = make_cfg()
    callback = LoggingCallback(cfg)
    callback.backends = [_Broken(cfg), recording_backend.Backend(cfg)]
    with pytest.raises(OSError, match="disk gone"):
        callback.finish()
    assert recording_backend.FINISHED == [False] and callback.backends == []
    # After a crash the crash must stay the exception, so a failing finish only warns.
    callback.backends = [_Broken(cfg), recording_backend.Backend(cfg)]
    with pytest.warns(UserWarning, match="disk gone"):
        callback.finish(failed=True)
    assert recording_backend.FINISHED == [False, True]
