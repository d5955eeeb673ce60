"""A run directory on object storage: ``memory://`` in this process for the fast cases, and a real
S3 endpoint (moto's server, started by the tests) for runs in their own processes."""

import json
import subprocess
import sys
import threading
import time

import fsspec
import pytest
import torch

from gatle_ignite.run.manifest import Manifest
from gatle_ignite.run.storage import StorageError, place_of, staging_dir
from gatle_ignite.run.storage.lease import Lease, lease_holder
from gatle_ignite.trainer.preemption import Preempted
from tests.conftest import ROOT, child_env
from tests.test_preemption import SignalledAt
from tests.toy.trainer import Trainer


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Staging directories and the read cache under the test's own folder; a short lease."""
    monkeypatch.setenv("GATLE_IGNITE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GATLE_IGNITE_LEASE_SECONDS", "3")


@pytest.fixture
def bucket(request):
    """A fresh ``memory://`` prefix, emptied after the test."""
    url = f"memory://bucket/{request.node.name}"
    yield url
    memory = fsspec.filesystem("memory")
    if memory.exists(f"/bucket/{request.node.name}"):
        memory.rm(f"/bucket/{request.node.name}", recursive=True)


def _keys(url: str) -> list:
    memory = fsspec.filesystem("memory")
    root = url.split("://", 1)[1]
    return sorted(p.split(root + "/", 1)[1] for p in memory.find("/" + root))


def _same_weights(a, b) -> bool:
    a, b = a.model.state_dict(), b.model.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- training into a URL (memory://) ----


def test_preempted_on_a_url_then_resumed_ends_bit_identical_to_a_local_run(
    make_cfg, bucket, tmp_path
):
    with pytest.raises(Preempted):
        SignalledAt(0, make_cfg(save_dir=bucket, max_epochs=3), at=6).fit()
    assert "latest_iter_checkpoint_6.pt" in _keys(bucket)
    # A new machine: nothing of the first process's staging directory is left.
    staging = staging_dir(bucket)
    assert staging.is_dir()
    import shutil

    shutil.rmtree(staging)
    resumed = Trainer(0, make_cfg(save_dir=bucket, max_epochs=3, resume=True)).fit()
    local = Trainer(0, make_cfg(save_dir=str(tmp_path / "local"), max_epochs=3)).fit()
    assert _same_weights(resumed, local)
    record = json.loads(fsspec.filesystem("memory").cat_file(bucket + "/run.json"))
    assert record["state"] == "completed"
    assert {e["file"] for e in record["checkpoints"]} <= set(_keys(bucket))


def test_a_used_prefix_is_refused_and_a_finished_run_resumed_does_nothing(cli, bucket, tmp_path):
    from tests.toy.config_file import write_toy_config

    config = write_toy_config(tmp_path / "cfg.py", save_dir=bucket, max_epochs=1)
    assert cli("train", config)[0] == 0
    before = _keys(bucket)
    code, _out, err = cli("train", config)
    assert code == 2
    assert f"save_dir {bucket} already holds run 'toy'" in err
    code, out, _err = cli("train", config, "resume=True")
    assert code == 0
    assert f"NOTHING TO DO: the run in {bucket} has trained all 1 of its max_epochs" in out
    assert _keys(bucket) == before


def test_only_the_runs_own_objects_are_ever_deleted(make_cfg, bucket):
    memory = fsspec.filesystem("memory")
    root = bucket.split("://", 1)[1]
    # A sibling prefix sharing the run's name as its start, and a user's file in the prefix.
    memory.pipe_file(f"/{root}_old/latest_epoch_checkpoint_1.pt", b"another run")
    memory.pipe_file(f"/{root}/notes.txt", b"mine")
    Trainer(0, make_cfg(save_dir=bucket, max_epochs=3, n_saved=1)).fit()
    indexed = {e.file for e in Manifest.read(staging_dir(bucket)).checkpoints}
    checkpoints = {k for k in _keys(bucket) if k.endswith(".pt")}
    assert checkpoints == indexed == {"latest_epoch_checkpoint_3.pt", _best(bucket)}
    Trainer(0, make_cfg(save_dir=bucket, max_epochs=1, replace_run=True)).fit()
    assert memory.cat_file(f"/{root}_old/latest_epoch_checkpoint_1.pt") == b"another run"
    assert memory.cat_file(f"/{root}/notes.txt") == b"mine"


def _best(url) -> str:
    return next(k for k in _keys(url) if k.startswith("valid_best_result"))


def test_a_local_run_imports_no_fsspec(tmp_path):
    script = (
        "import sys\n"
        "from gatle_ignite.cli.main import main\n"
        "from tests.toy.config_file import write_toy_config\n"
        f"config = write_toy_config({str(tmp_path / 'cfg.py')!r}, "
        f"save_dir={str(tmp_path / 'run')!r}, max_epochs=1)\n"
        "assert main(['train', '--config=' + config]) == 0\n"
        "print('fsspec' in sys.modules, 's3fs' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=child_env()
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False False"


# ---- the lease ----


def _note(host="elsewhere", pid=1, expires_in=30.0, **fields) -> bytes:
    note = {"holder": "x", "pid": pid, "host": host, "command": "gatle-ignite train"}
    return json.dumps({**note, "expires": time.time() + expires_in, **fields}).encode()


def test_a_live_lease_refuses_a_second_writer_and_a_dead_one_is_taken_over(bucket):
    place = place_of(bucket, local=staging_dir(bucket))
    place.create("run.lease", _note())
    stop = threading.Event()

    def holder_renews():
        while not stop.wait(0.3):
            found = place.read_tagged("run.lease")
            place.replace("run.lease", _note(), found[1])

    renewing = threading.Thread(target=holder_renews, daemon=True)
    renewing.start()
    try:
        with pytest.raises(Exception, match="in use by another gatle-ignite process"):
            Lease(place).acquire()
    finally:
        stop.set()
        renewing.join()
    # The holder stopped renewing: its lease runs out and is taken over.
    lease = Lease(place)
    lease.acquire()
    assert lease_holder(place)["holder"] == lease.token
    lease.release()
    assert lease_holder(place) is None


def test_a_released_or_expired_lease_is_taken_at_once(bucket):
    place = place_of(bucket, local=staging_dir(bucket))
    for note in (_note(released=True), _note(expires_in=-1)):
        place.fs.pipe_file(place.key("run.lease"), note)
        started = time.monotonic()
        lease = Lease(place)
        lease.acquire()
        assert time.monotonic() - started < 2
        lease.release()


def test_a_lease_taken_over_behind_its_holders_back_stops_its_writes(bucket):
    place = place_of(bucket, local=staging_dir(bucket))
    lease = Lease(place)
    lease.acquire()
    place.guard = lease.check
    place.fs.pipe_file(place.key("run.lease"), _note())
    deadline = time.monotonic() + 30
    while lease.lost is None:
        assert time.monotonic() < deadline, "the heartbeat never noticed"
        time.sleep(0.1)
    with pytest.raises(StorageError, match="another process took over the lease"):
        place.publish_bytes("run.json", b"{}")
    lease.release()
    assert json.loads(place.read_bytes("run.lease"))["host"] == "elsewhere"


# ---- on a real S3 endpoint, each run its own process ----

S3_FIELDS = {
    "main_runner": "tests.toy.dist_trainer",
    "max_epochs": 3,
    "model_params": {"dropout": 0.3},
    "train_ds_name": "tests.toy.data_aug",
    "train_ds_params": {"n": 64, "bs": 16, "shuffle": True, "num_workers": 2},
    "lr_scheduler": "gatle_ignite.schedulers.warmup_cosine",
}
TIMEOUT = 300


@pytest.fixture(scope="module")
def s3():
    from tests.s3_server import S3Server

    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3, request):
    """A fresh bucket on the endpoint: its s3:// URL, and a boto3 client of it."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    name = request.node.name.replace("_", "-")[:50].strip("-").lower()
    client.create_bucket(Bucket=name)
    return f"s3://{name}", client


def _s3_keys(client, bucket_url) -> list:
    bucket = bucket_url.split("://", 1)[1]
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def _s3_config(tmp_path, name, **fields):
    path = tmp_path / f"{name}.py"
    path.write_text(
        "from tests.toy.config import toy_config\n\n\n"
        f"def get_config():\n    return toy_config(**{ {**S3_FIELDS, **fields}!r})\n"
    )
    return str(path)


def _s3_env(s3, tmp_path, machine="one", **extra):
    """A child's environment on 'machine': its own cache, so a second machine starts bare."""
    return child_env(
        **s3.env(),
        GATLE_IGNITE_CACHE=str(tmp_path / f"cache_{machine}"),
        GATLE_IGNITE_LEASE_SECONDS="3",
        **extra,
    )


def _cli(env, *args, timeout=TIMEOUT, module="gatle_ignite"):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _start(env, *args):
    return subprocess.Popen(
        [sys.executable, "-m", "gatle_ignite", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def _until(process, text):
    lines = []
    for line in process.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError("the run ended first:\n" + "".join(lines[-30:]))


def _final_weights(folder):
    return torch.load(folder / "final_weights.pt", weights_only=True)


def _identical(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def s3_reference(tmp_path_factory):
    """The uninterrupted run, in a local save_dir."""
    tmp = tmp_path_factory.mktemp("s3_reference")
    config = _s3_config(tmp, "local", save_dir=str(tmp / "local"))
    done = _cli(child_env(), "train", f"--config={config}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return _final_weights(tmp / "local")


@pytest.mark.slow
def test_on_s3_sigterm_exits_75_and_another_machine_resumes_bit_identical(
    s3, s3_bucket, tmp_path, s3_reference
):
    bucket, client = s3_bucket
    url = f"{bucket}/run"
    probes = tmp_path / "probes"
    fields = {"save_dir": url, "probe_dir": str(probes)}
    stopped = _s3_config(tmp_path, "stopped", **fields, fault_sigterm_rank=0, fault_sigterm_at=6)
    first = _s3_env(s3, tmp_path, "one")
    done = _cli(first, "train", f"--config={stopped}")
    assert done.returncode == 75, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"saved {url}/latest_iter_checkpoint_6.pt" in done.stdout
    assert "run/latest_iter_checkpoint_6.pt" in _s3_keys(client, bucket)
    status = _cli(first, "status", url)
    assert status.returncode == 75 and "preempted" in status.stdout, status.stdout
    second = _s3_env(s3, tmp_path, "two")
    # The same config: its signal was at iteration 6, which the resumed run never repeats.
    config = stopped
    done = _cli(second, "train", f"--config={config}", "--override=resume=True")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"RESUMING FROM: {url}/latest_iter_checkpoint_6.pt" in done.stdout
    assert _identical(_final_weights(probes), s3_reference)
    status = _cli(second, "status", url)
    assert status.returncode == 0 and "completed" in status.stdout, status.stdout
    evaluated = _cli(_s3_env(s3, tmp_path, "three"), "eval", f"--config={config}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f"LOADING CHECKPOINT: {url}/valid_best_result_checkpoint_" in evaluated.stdout
    runs = _cli(second, "runs", bucket, "--csv")
    assert runs.returncode == 0 and "completed" in runs.stdout, runs.stderr[-2000:]


@pytest.mark.slow
def test_two_writers_on_one_prefix_the_second_is_refused(s3, s3_bucket, tmp_path):
    import os
    import signal

    bucket, _client = s3_bucket
    url = f"{bucket}/run"
    # Slow enough that the first is still training while the second starts and is refused.
    config = _s3_config(
        tmp_path, "slow", save_dir=url, probe_dir=str(tmp_path / "p"), iter_sleep_s=5.0
    )
    resume = ["--override=resume=True"]
    first = _start(_s3_env(s3, tmp_path, "one"), "train", f"--config={config}")
    try:
        _until(first, " TRAIN epoch ")
        second = _cli(_s3_env(s3, tmp_path, "two"), "train", f"--config={config}", *resume)
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert f"{url} is in use by another gatle-ignite process (pid {first.pid}" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=TIMEOUT)
    # Killed without a word: its lease (of a process gone from this host) is taken over at once.
    fast = ["--override=iter_sleep_s=0.0", "--override=accept_changes=['iter_sleep_s']"]
    third = _cli(_s3_env(s3, tmp_path, "two"), "train", f"--config={config}", *resume, *fast)
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    assert "TRAINING COMPLETE after 3 epochs" in third.stdout


def _loads_everywhere(client, bucket_url, tmp_path) -> list:
    """Every checkpoint object in the bucket, downloaded and loaded; their keys."""
    bucket = bucket_url.split("://", 1)[1]
    keys = [k for k in _s3_keys(client, bucket_url) if k.endswith(".pt")]
    for key in keys:
        local = tmp_path / "downloaded.pt"
        client.download_file(bucket, key, str(local))
        torch.load(local, weights_only=True)
    return keys


@pytest.mark.slow
def test_sigkill_mid_upload_leaves_no_half_checkpoint_visible(
    s3, s3_bucket, tmp_path, s3_reference
):
    bucket, client = s3_bucket
    url = f"{bucket}/run"
    name = bucket.split("://", 1)[1]
    # Past s3fs's single-request size, so an upload is a multipart one, seen while it runs.
    config = _s3_config(
        tmp_path, "run", save_dir=url, probe_dir=str(tmp_path / "p"), ballast_mb=120
    )
    process = _start(_s3_env(s3, tmp_path, "one"), "train", f"--config={config}")
    import os
    import signal

    try:
        deadline = time.monotonic() + TIMEOUT
        while not client.list_multipart_uploads(Bucket=name).get("Uploads"):
            assert process.poll() is None, "the run ended before an upload was seen"
            assert time.monotonic() < deadline, "no upload was seen"
            time.sleep(0.005)
        uploading = client.list_multipart_uploads(Bucket=name)["Uploads"][0]["Key"]
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=TIMEOUT)
    visible = _loads_everywhere(client, bucket, tmp_path)
    assert uploading not in visible
    done = _cli(
        _s3_env(s3, tmp_path, "two"), "train", f"--config={config}", "--override=resume=True"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _identical(_final_weights(tmp_path / "p"), s3_reference)


# What a client does when the endpoint stops answering: a second to connect or read, one try
# of its own (ours are ATTEMPTS), so that the bound comes within a test's patience.
_IMPATIENT = json.dumps(
    {"config_kwargs": {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 1}}}
)


def _secrets_absent(*texts) -> bool:
    from tests.s3_server import SECRET_KEY, SESSION_TOKEN

    return not any(secret in text for text in texts for secret in (SECRET_KEY, SESSION_TOKEN))


def test_the_secret_check_finds_a_printed_secret(s3):
    shown = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['AWS_SECRET_ACCESS_KEY'])"],
        capture_output=True,
        text=True,
        env=child_env(**s3.env()),
    )
    assert not _secrets_absent(shown.stdout)


@pytest.mark.slow
def test_an_endpoint_that_stops_answering_ends_the_run_with_what_to_run_and_no_secret(
    s3, s3_bucket, tmp_path, s3_reference
):
    import os
    import signal

    bucket, client = s3_bucket
    url = f"{bucket}/run"
    config = _s3_config(
        tmp_path, "run", save_dir=url, probe_dir=str(tmp_path / "p"), iter_sleep_s=0.2
    )
    env = _s3_env(s3, tmp_path, "one", FSSPEC_S3=_IMPATIENT, GATLE_IGNITE_STORAGE_TIMEOUT="5")
    process = _start(env, "train", f"--config={config}")
    try:
        _until(process, "TRAIN epoch 1: 2/4")
        os.kill(s3.process.pid, signal.SIGSTOP)
        output = process.communicate(timeout=TIMEOUT)[0]
    finally:
        os.kill(s3.process.pid, signal.SIGCONT)
    assert process.returncode == 1, output[-3000:]
    assert "storage error:" in output and "did not answer" in output, output[-3000:]
    assert "is safe on this machine, in " in output
    assert f"python -m gatle_ignite.run.storage {tmp_path / 'cache_one' / 'staging'}" in output
    records = [p.read_text() for p in (tmp_path / "cache_one").rglob("*.json")]
    assert _secrets_absent(output, *records)
    # The endpoint answers again: the command it gave publishes the checkpoint it kept.
    command = next(line for line in output.splitlines() if "python -m gatle_ignite" in line)
    words = command.split("python -m gatle_ignite.run.storage ", 1)[1].split()
    published = _cli(env, *words, module="gatle_ignite.run.storage")
    assert published.returncode == 0, published.stdout + published.stderr
    assert "PUBLISHED" in published.stdout
    done = _cli(
        _s3_env(s3, tmp_path, "two"), "train", f"--config={config}", "--override=resume=True"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _identical(_final_weights(tmp_path / "p"), s3_reference)
    assert _secrets_absent(done.stdout, done.stderr)


@pytest.mark.slow
def test_fsdp_on_two_ranks_to_s3_resumes_there_and_consolidates_from_and_to_the_url(
    s3, s3_bucket, tmp_path
):
    bucket, client = s3_bucket
    url = f"{bucket}/run"
    fields = {
        "strategy": "fsdp",
        "fsdp_params": {"wrap": ["Linear"]},
        "train_ds_params": {"n": 64, "bs": 16, "shuffle": True},
        "save_dir": url,
        "probe_dir": str(tmp_path / "p"),
    }
    two = [
        "--override=nproc_per_node=2",
        "--override=dist_backend='gloo'",
        "--override=auto_model_params.sync_bn=False",
    ]
    config = _s3_config(tmp_path, "run", **fields, fault_sigterm_rank=1, fault_sigterm_at=6)
    env = _s3_env(s3, tmp_path, "one")
    done = _cli(env, "train", f"--config={config}", *two)
    assert done.returncode == 75, done.stdout[-3000:] + done.stderr[-3000:]
    keys = _s3_keys(client, bucket)
    assert "run/latest_iter_checkpoint_6.dcp/.metadata" in keys
    assert not [k for k in keys if ".partial-" in k]
    done = _cli(
        _s3_env(s3, tmp_path, "two"), "train", f"--config={config}", *two, "--override=resume=True"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"RESUMING FROM: {url}/latest_iter_checkpoint_6.dcp" in done.stdout
    shards = [
        k for k in _s3_keys(client, bucket) if k.startswith("run/latest_epoch_checkpoint_3.dcp/")
    ]
    assert len([k for k in shards if k.endswith(".distcp")]) == 2
    whole = f"{bucket}/consolidated/whole.pt"
    merged = _cli(env, "consolidate", f"{url}/latest_epoch_checkpoint_3.dcp", whole)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    local = tmp_path / "whole.pt"
    client.download_file(bucket.split("://", 1)[1], "consolidated/whole.pt", str(local))
    model = torch.load(local, weights_only=True)["model"]
    assert _identical(model, _final_weights(tmp_path / "p"))


@pytest.mark.slow
def test_a_sweep_with_its_dir_on_s3_continues_on_another_machine(s3, s3_bucket, tmp_path):
    pytest.importorskip("optuna", reason="the sweep extra is not installed")
    bucket, client = s3_bucket
    sweep = f"{bucket}/sweep"
    config = _s3_config(tmp_path, "toy", save_dir=str(tmp_path / "by_hand"), max_epochs=1)
    args = [
        "sweep",
        f"--config={config}",
        "--dir",
        sweep,
        "--param=optimizer_params.lr=[0.01, 0.05]",
    ]
    done = _cli(_s3_env(s3, tmp_path, "one"), *args, "--trials=2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    keys = _s3_keys(client, bucket)
    assert {"sweep/sweep.json", "sweep/study.journal"} <= set(keys)
    assert {"sweep/trial_0000/run.json", "sweep/trial_0001/run.json"} <= set(keys)
    # Another machine: no staging directory; the record and the journal come from the bucket.
    done = _cli(_s3_env(s3, tmp_path, "two"), *args, "--trials=3")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "trial 2 started" in done.stdout and "trial 0 started" not in done.stdout
    runs = _cli(_s3_env(s3, tmp_path, "two"), "runs", sweep, "--csv")
    assert runs.returncode == 0, runs.stderr[-2000:]
    assert len([line for line in runs.stdout.splitlines()[1:] if line.strip()]) == 3


def test_a_store_without_conditional_writes_gets_a_lease_written_then_read_back(
    tmp_path, monkeypatch
):
    from gatle_ignite.run.storage import remote

    monkeypatch.setattr(remote, "VERIFY_SECONDS", 0.1)
    url = f"file://{tmp_path / 'store' / 'run'}"
    place = place_of(url, local=staging_dir(url))
    assert not place.conditional
    tag = place.create("run.lease", b"first")
    assert tag is not None and place.create("run.lease", b"second") is None
    assert place.replace("run.lease", b"third", "not its version") is None
    assert place.replace("run.lease", b"third", tag) is not None
    assert place.read_bytes("run.lease") == b"third"
    place.fs.rm(place.key("run.lease"))
    with pytest.warns(UserWarning, match="does not write on a condition"):
        lease = Lease(place)
        lease.acquire()
    assert lease_holder(place)["holder"] == lease.token
    lease.release()


def test_a_checkpoint_is_fetched_once_until_the_store_holds_another_version(bucket, tmp_path):
    place = place_of(bucket, local=tmp_path / "read")
    name = "latest_epoch_checkpoint_1.pt"
    place.fs.pipe_file(place.key(name), b"first version")
    local = place.fetch(name)
    written = local.stat().st_mtime_ns
    time.sleep(0.01)
    assert place.fetch(name).stat().st_mtime_ns == written  # the same version: not fetched
    place.fs.pipe_file(place.key(name), b"second version")
    assert place.fetch(name).read_bytes() == b"second version"
