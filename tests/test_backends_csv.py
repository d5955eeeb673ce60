"""The csv backend: ``<save_dir>/metrics.csv`` read back with the csv module."""

import os

from gatle_ignite.callbacks.backends.csv import Backend
from tests.backend_fixtures import csv_rows, csv_series, synthetic_cfg, train
from tests.toy import plain_backend


def test_metrics_csv_has_one_row_per_logged_value(tmp_path):
    cfg = synthetic_cfg(tmp_path / "run", ["csv"])
    train(cfg)

    with open(os.path.join(cfg.save_dir, "metrics.csv"), encoding="utf-8") as handle:
        assert handle.readline().strip() == "wall_time,epoch,step,name,value"
    rows = csv_rows(cfg.save_dir)
    names = {row["name"] for row in rows}
    assert {"train/lr_0", "train/loss_avg", "train/loss_ce_avg", "valid/acc"} <= names
    acc = csv_series(cfg.save_dir, "valid/acc")
    assert [(epoch, step) for epoch, step, _ in acc] == [(1, 8), (2, 16)]
    assert all(0.0 <= value <= 1.0 for _, _, value in acc)
    lrs = csv_series(cfg.save_dir, "train/lr_0")
    assert [(epoch, step) for epoch, step, _ in lrs] == [(1, 4), (1, 8), (2, 12), (2, 16)]
    assert lrs[1][2] == 1e-3
    times = [float(row["wall_time"]) for row in rows]
    assert times == sorted(times)


def test_a_resumed_run_appends_and_a_fresh_one_starts_over(make_cfg):
    cfg = make_cfg()
    backend = Backend(cfg)
    backend.log({"train/lr_0": 0.5, "valid/cm": [1, 2]}, step=1)
    backend.finish()
    cfg.resume = True
    backend = Backend(cfg)
    backend.log({"valid/acc": 0.25}, epoch=1)
    backend.finish()
    assert [(r["epoch"], r["step"], r["name"], r["value"]) for r in csv_rows(cfg.save_dir)] == [
        ("", "1", "train/lr_0", "0.5"),
        ("", "1", "valid/cm", "[1, 2]"),
        ("1", "", "valid/acc", "0.25"),
    ]
    cfg.resume = False
    Backend(cfg).finish()
    assert csv_rows(cfg.save_dir) == []


def test_points_written_together_reach_the_csv_and_a_sink_of_04s_protocol_alike(tmp_path):
    """Points are written to the sinks in batches (the csv in one write and one flush); a sink
    without ``log_many`` is told each point in order, as before."""
    plain_backend.LOGGED.clear()
    cfg = synthetic_cfg(tmp_path / "run", ["csv", "tests.toy.plain_backend"], log_every=1)
    train(cfg)
    logged = plain_backend.LOGGED
    told = [(epoch, step, m["train/lr_0"]) for m, step, epoch in logged if "train/lr_0" in m]
    lrs = csv_series(cfg.save_dir, "train/lr_0")
    assert [(epoch, step) for epoch, step, _ in lrs] == [(e, s) for e, s, _ in told]
    assert [step for _, step, _ in lrs] == list(range(1, 17))
    assert [value for _, _, value in lrs] == [value for _, _, value in told]


def test_log_many_writes_the_rows_log_would_in_one_flush(make_cfg, monkeypatch):
    records = [({"train/lr_0": 0.5, "train/loss": 2.0}, 1, 1), ({"train/lr_0": 0.25}, 2, 1)]
    backend = Backend(make_cfg())
    flushes, flush = [], backend.file.flush
    monkeypatch.setattr(backend.file, "flush", lambda: flushes.append(flush()), raising=False)
    backend.log_many(records)
    assert len(flushes) == 1
    backend.finish()
    assert [(r["epoch"], r["step"], r["name"], r["value"]) for r in csv_rows(backend.save_dir)] == [
        ("1", "1", "train/lr_0", "0.5"),
        ("1", "1", "train/loss", "2.0"),
        ("1", "2", "train/lr_0", "0.25"),
    ]
