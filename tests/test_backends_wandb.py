"""The wandb backend against the real wandb package, offline: the run read back from its file."""

from gatle_ignite.callbacks.run_record import REDACTED
from tests.backend_fixtures import WandbRun, synthetic_cfg, train, use_wandb_offline


def test_the_offline_run_holds_the_history_the_redacted_config_and_a_clean_exit(
    tmp_path, monkeypatch
):
    root = use_wandb_offline(tmp_path, monkeypatch)
    cfg = synthetic_cfg(tmp_path / "run", ["wandb"])
    cfg.tags = ["smoke", "https://user:not-a-real-pw@data.invalid/x"]
    cfg.discord_url = "https://discord.invalid/api/webhooks/1/not-a-real-token"
    cfg.apiKey = "not-a-real-key"
    train(cfg)

    run = WandbRun(root, cfg.name)
    assert (run.run.run_id, run.run.display_name) == (cfg.name, cfg.name)
    assert run.run.project == "gatle-synthetic"
    assert list(run.run.tags) == ["smoke", "https://<redacted>@data.invalid/x"]

    acc = run.series("valid/acc")
    assert [epoch for epoch, _ in acc] == [1, 2]
    assert all(0.0 <= value <= 1.0 for _, value in acc)
    assert [epoch for epoch, _ in run.series("train/loss_avg")] == [1, 2]
    # log_every=4 over 8 iterations an epoch: two learning-rate points per epoch.
    lrs = run.series("train/lr_0")
    assert [epoch for epoch, _ in lrs] == [1, 1, 2, 2]
    assert lrs[1][1] == 1e-3  # the end of the one warm-up epoch: the peak rate

    assert run.config["max_epochs"] == 2
    assert run.config["train_ds_params"]["n"] == 512
    assert run.config["logger_name"] == ["wandb"]
    assert run.config["discord_url"] == run.config["apiKey"] == REDACTED
    assert run.config["tags"] == list(run.run.tags)
    assert run.exit_code == 0
