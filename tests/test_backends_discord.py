"""The discord backend posting to a real HTTP server on loopback."""

import pytest

from gatle_ignite import ConfigError
from gatle_ignite.callbacks.logging import LoggingCallback
from tests.backend_fixtures import Webhook, need, synthetic_cfg, train
from tests.toy.trainer import Trainer


@pytest.fixture(autouse=True)
def _requests_installed():
    need("requests")


def test_a_run_posts_its_start_its_results_and_its_completion(tmp_path, capsys):
    with Webhook() as hook:
        cfg = synthetic_cfg(tmp_path / "run", ["discord"], log_every=8)
        cfg.discord_url = hook.url
        train(cfg)

    # One post per epoch, train and valid metrics together; no per-iteration points.
    assert hook.descriptions == [
        "Run started",
        "Results for Epoch 1",
        "Results for Epoch 2",
        "Run complete",
    ]
    assert {post["username"] for post in hook.posts} == {"gatle"}
    assert {post["embeds"][0]["title"] for post in hook.posts} == {cfg.name}
    valid = [
        field
        for post in hook.posts
        for field in post["embeds"][0]["fields"]
        if field["name"] == "valid/acc"
    ]
    assert len(valid) == 2 and all(field["inline"] for field in valid)
    assert all(0.0 <= float(field["value"]) <= 1.0 for field in valid)
    train_fields = [f["name"] for f in hook.posts[1]["embeds"][0]["fields"]]
    assert train_fields == sorted(train_fields) and "train/loss_avg" in train_fields
    assert "[discord] failed" not in capsys.readouterr().out


def test_the_webhook_comes_from_the_environment_when_the_config_has_none(make_cfg, monkeypatch):
    with Webhook() as hook:
        monkeypatch.setenv("DISCORD_WEBHOOK_URL", hook.url)
        LoggingCallback(make_cfg(logger_name=["discord"])).start().finish(failed=True)
    assert hook.descriptions == ["Run started", "Run failed"]


def test_no_webhook_at_all_is_a_config_error(make_cfg, monkeypatch):
    monkeypatch.delenv("DISCORD_WEBHOOK_URL", raising=False)
    with pytest.raises(ConfigError, match="discord_url"):
        LoggingCallback(make_cfg(logger_name=["discord"])).start()


def test_a_refusing_or_unreachable_webhook_never_stops_training_nor_prints_its_token(
    make_cfg, tmp_path, capsys
):
    with Webhook(status=404) as refusing:
        cfg = make_cfg(save_dir=str(tmp_path / "a"), max_epochs=1, logger_name=["discord"])
        cfg.discord_url = refusing.url
        Trainer(0, cfg).fit()
    assert len(refusing.posts) == 3
    # The server is gone, so its port now refuses connections.
    cfg.save_dir = str(tmp_path / "b")
    Trainer(0, cfg).fit()

    out = capsys.readouterr().out
    assert out.count("[discord] failed to send: ") == 6
    assert "404 Client Error" in out and "Max retries exceeded" in out
    assert "not-a-real-token" not in out
    assert out.count("TRAINING COMPLETE after 1 epoch\n") == 2
