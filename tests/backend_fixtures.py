"""Helpers for the backend tests: the synthetic run, a loopback webhook, and readers that open
what each backend left behind with that backend's own tools."""

import atexit
import csv
import glob
import importlib
import json
import os
import shutil
import struct
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gatle_ignite.config.loader import apply_overrides, load_config_from_file
from gatle_ignite.dispatch import import_entrypoint

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = ROOT / "examples" / "synthetic" / "configs" / "synthetic_v0.py"
# 512 samples at bs 64 with drop_last: 8 iterations an epoch, so log_every=4 logs twice an epoch.
SYNTHETIC_OVERRIDES = ("max_epochs=2", "train_ds_params.n=512", "valid_ds_params.n=256")


def need(module: str):
    """Import ``module``. Locally a missing package skips the test; in CI (``CI`` set) it fails."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def synthetic_cfg(save_dir, logger_name, log_every=4):
    """The shipped synthetic example's config, cut to 2 short epochs and saving under save_dir."""
    cfg = load_config_from_file(SYNTHETIC)
    apply_overrides(cfg, [*SYNTHETIC_OVERRIDES, f"log_every={log_every}"])
    cfg.save_dir = str(save_dir)
    cfg.logger_name = list(logger_name)
    return cfg


def train(cfg):
    """Build the config's own trainer and fit it; returns the trainer."""
    return import_entrypoint(cfg.main_runner, "Trainer")(0, cfg).fit()


# ---- W&B: the offline run's transaction log ----

# The .wandb file is a LevelDB-style log: 32 KiB blocks of chunks, each behind a 7-byte header
# (checksum, length, type), after a 7-byte file header. Each whole record is a wandb protobuf.
_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _log_records(data: bytes):
    ident, _magic, _version = struct.unpack("<4sHB", data[:_HEADER])
    assert ident == b":W&B", ident
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _HEADER:
            pos += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        pos += _HEADER
        chunk = data[pos : pos + length]
        pos += length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
        else:
            return


class WandbRun:
    """An offline W&B run read back from its ``run-<id>.wandb`` file with wandb's own protobufs."""

    def __init__(self, wandb_dir, run_id: str):
        # run.finish() can return while wandb-core is still writing the file; teardown waits.
        importlib.import_module("wandb").teardown()
        pb = importlib.import_module("wandb.proto.wandb_internal_pb2")
        (path,) = glob.glob(
            os.path.join(str(wandb_dir), "wandb", "offline-run-*", f"run-{run_id}.wandb")
        )
        self.records = []
        with open(path, "rb") as handle:
            for raw in _log_records(handle.read()):
                record = pb.Record()
                record.ParseFromString(raw)
                self.records.append(record)

    def _of(self, kind: str) -> list:
        return [getattr(r, kind) for r in self.records if r.WhichOneof("record_type") == kind]

    @staticmethod
    def _key(item) -> str:
        return item.key or "/".join(item.nested_key)

    @property
    def run(self):
        return self._of("run")[0]

    @property
    def config(self) -> dict:
        updates = [u for run in self._of("run") for u in run.config.update]
        updates += [u for config in self._of("config") for u in config.update]
        return {self._key(u): json.loads(u.value_json) for u in updates if self._key(u) != "_wandb"}

    @property
    def history(self) -> list:
        return [
            {self._key(item): json.loads(item.value_json) for item in history.item}
            for history in self._of("history")
        ]

    def series(self, name: str) -> list:
        """``(epoch, value)`` for every history row that holds ``name``."""
        return [(row.get("epoch"), row[name]) for row in self.history if name in row]

    @property
    def exit_code(self) -> int:
        (exit_record,) = self._of("exit")
        return exit_record.exit_code


def use_wandb_offline(tmp_path, monkeypatch) -> Path:
    """Make W&B offline and silent, writing under tmp_path, with no credential around."""
    wandb = need("wandb")
    # W&B reads its environment once per process: start afresh so this test's settings apply.
    wandb.teardown()
    root = tmp_path / "wandb_root"
    root.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(root))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return root


# ---- MLflow: a local sqlite store ----


_MIGRATED = []


def _migrated_mlflow_db() -> Path:
    """An empty, fully migrated MLflow sqlite store, built once per process: migrating is slow."""
    if not _MIGRATED:
        mlflow = need("mlflow")
        folder = Path(tempfile.mkdtemp(prefix="gatle-mlflow-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = folder / "template.db"
        mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
        _MIGRATED.append(path)
    return _MIGRATED[0]


def use_mlflow_store(tmp_path, monkeypatch) -> str:
    """Point ``MLFLOW_TRACKING_URI`` at a fresh copy of the migrated store; returns the URI."""
    path = tmp_path / "mlflow.db"
    shutil.copy(_migrated_mlflow_db(), path)
    uri = f"sqlite:///{path}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def mlflow_run(uri: str, experiment: str, name: str):
    """``(client, run)`` for the one run called ``name`` in ``experiment``."""
    mlflow = need("mlflow")
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    (run,) = client.search_runs(
        [found.experiment_id], filter_string=f"attributes.run_name = '{name}'"
    )
    return client, run


def mlflow_series(client, run, name: str) -> list:
    """``(step, value)`` of one metric, in step order."""
    history = client.get_metric_history(run.info.run_id, name)
    return sorted((m.step, m.value) for m in history)


# ---- TensorBoard and CSV ----


def tensorboard_series(save_dir, name: str) -> list:
    """``(step, value)`` of one scalar, read with TensorBoard's own event reader."""
    accumulator_module = need("tensorboard.backend.event_processing.event_accumulator")
    accumulator = accumulator_module.EventAccumulator(os.path.join(str(save_dir), "tensorboard"))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(name)]


def csv_rows(save_dir) -> list:
    with open(os.path.join(str(save_dir), "metrics.csv"), newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def csv_series(save_dir, name: str) -> list:
    """``(epoch, step, value)`` of one metric; an absent epoch or step reads as None."""
    return [
        (
            int(row["epoch"]) if row["epoch"] else None,
            int(row["step"]) if row["step"] else None,
            float(row["value"]),
        )
        for row in csv_rows(save_dir)
        if row["name"] == name
    ]


# ---- Discord: a webhook on loopback ----


class Webhook:
    """A real HTTP server on 127.0.0.1 (ephemeral port) that keeps every JSON body posted to it.

    Use it as a context manager; leaving it stops the server and joins its thread.
    """

    TOKEN_PATH = "/api/webhooks/123/not-a-real-token"

    def __init__(self, status: int = 204):
        self.posts = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                posts.append(json.loads(self.rfile.read(length)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{self.TOKEN_PATH}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    @property
    def descriptions(self) -> list:
        return [post["embeds"][0]["description"] for post in self.posts]
