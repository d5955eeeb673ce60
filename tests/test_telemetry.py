"""Where a run's time goes: the perf/ rows, the FLOP count, the summary's advice, the profiler."""

import contextlib
import csv
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from gatle_ignite.callbacks.perf_line import perf_line
from gatle_ignite.cli.main import main
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.trainer.telemetry import epochs, flops
from gatle_ignite.trainer.telemetry.devices import peak_tflops_of
from gatle_ignite.trainer.telemetry.threads import oversubscription, usable_cores
from gatle_ignite.utils.checkpoints import find_latest_checkpoint
from tests.conftest import HANG_S, ROOT, child_env, run_gatle
from tests.toy.config_file import write_toy_config
from tests.toy.trainer import Trainer

EVERY_EPOCH = (
    "perf/epoch_time_s",
    "perf/train_time_s",
    "perf/data_wait_share",
    "perf/eval_time_s",
    "perf/checkpoint_stall_s",
    "perf/peak_memory_mb",
    "perf/samples_per_s",
    "perf/achieved_tflops",
)
SHORT_PROFILE = {"wait": 1, "warmup": 1, "active": 2}


def _perf(save_dir) -> dict:
    """``{epoch: {name: value}}`` of the perf/ rows in the run's metrics.csv."""
    rows = {}
    with open(save_dir / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["name"].startswith("perf/"):
                rows.setdefault(int(row["epoch"]), {})[row["name"]] = float(row["value"])
                rows[int(row["epoch"])]["step"] = int(row["step"])
    return rows


def _weights(task) -> dict:
    return {k: v.clone() for k, v in task.model.state_dict().items()}


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _mlp_flops(batch, inputs=8, hidden=16, outputs=3) -> int:
    """The toy MLP's forward and backward, counted by hand (a multiply-add is 2 FLOPs)."""
    forward = 2 * batch * (inputs * hidden + hidden * outputs)
    # Backward: both weight gradients, and the hidden activation's gradient; the input's
    # gradient is never computed, as no parameter comes before the first layer.
    backward = 2 * batch * hidden * outputs * 2 + 2 * batch * inputs * hidden
    return forward + backward


# ----------------------------------------------------------------------------- perf/ rows


def test_every_epoch_logs_its_perf_rows_with_sane_values(make_cfg, tmp_path, capsys):
    Trainer(0, make_cfg(max_epochs=2, logger_name=["text"])).fit()
    rows = _perf(tmp_path / "run")
    assert sorted(rows) == [1, 2]
    for epoch, row in rows.items():
        assert set(EVERY_EPOCH) <= set(row), sorted(set(EVERY_EPOCH) - set(row))
        assert row["step"] == 4 * epoch  # the trainer's iteration, as every other metric
        assert 0 <= row["perf/data_wait_share"] <= 1
        for name in ("epoch_time_s", "train_time_s", "eval_time_s", "checkpoint_stall_s"):
            assert row[f"perf/{name}"] > 0, name
        assert row["perf/peak_memory_mb"] > 0 and row["perf/samples_per_s"] > 0
        # The parts are measured inside the whole, so they cannot add up to more.
        parts = row["perf/train_time_s"] + row["perf/eval_time_s"]
        assert parts + row["perf/checkpoint_stall_s"] <= row["perf/epoch_time_s"]
        assert "perf/mfu" not in row  # no peak is known for a CPU
    assert "perf/flops_per_step" in rows[1] and "perf/flops_per_step" not in rows[2]
    out = capsys.readouterr().out
    assert out.count("\nperf   epoch ") == 2
    assert "samples/s | peak " in out
    # Logged, yet a CPU's hundred-thousandth of a TFLOP/s is not shown on the line.
    assert all(row["perf/achieved_tflops"] < 0.01 for row in rows.values())
    assert "TFLOP/s" not in out


def test_flops_per_step_is_the_analytic_count_of_the_model(make_cfg, tmp_path):
    Trainer(0, make_cfg(max_epochs=1)).fit()
    assert _perf(tmp_path / "run")[1]["perf/flops_per_step"] == _mlp_flops(batch=16)


def test_achieved_flops_are_the_steps_flops_over_the_training_time(make_cfg, tmp_path):
    Trainer(0, make_cfg(max_epochs=1)).fit()
    row = _perf(tmp_path / "run")[1]
    expected = row["perf/flops_per_step"] * 4 / row["perf/train_time_s"] / 1e12
    assert row["perf/achieved_tflops"] == pytest.approx(expected)
    assert row["perf/samples_per_s"] == pytest.approx(64 / row["perf/train_time_s"])


def test_count_flops_false_counts_nothing(make_cfg, tmp_path):
    Trainer(0, make_cfg(max_epochs=1, count_flops=False)).fit()
    row = _perf(tmp_path / "run")[1]
    assert "perf/flops_per_step" not in row and "perf/achieved_tflops" not in row
    assert "perf/samples_per_s" in row


def test_tokens_per_s_comes_from_the_info_key(make_cfg, tmp_path):
    params = {"n": 64, "bs": 16, "tokens_per_sample": 128}
    Trainer(
        0, make_cfg(max_epochs=1, train_ds_name="tests.toy.perf_data", train_ds_params=params)
    ).fit()
    row = _perf(tmp_path / "run")[1]
    assert row["perf/tokens_per_s"] == pytest.approx(128 * row["perf/samples_per_s"])


def test_without_the_info_key_there_is_no_tokens_figure(make_cfg, tmp_path):
    Trainer(0, make_cfg(max_epochs=1)).fit()
    assert "perf/tokens_per_s" not in _perf(tmp_path / "run")[1]


# ----------------------------------------------------------------------------- the FLOP count


def _norm_cfg(make_cfg, **fields):
    """BatchNorm and dropout, a shuffled loader and a schedule: what a stray step would move."""
    return make_cfg(
        max_epochs=2,
        model_name="tests.toy.norm_model",
        lr_scheduler="gatle_ignite.schedulers.warmup_cosine",
        **fields,
    )


def test_counting_flops_changes_nothing_the_run_computes(make_cfg, tmp_path):
    counted = Trainer(0, _norm_cfg(make_cfg, save_dir=str(tmp_path / "a"))).fit()
    plain = Trainer(0, _norm_cfg(make_cfg, save_dir=str(tmp_path / "b"), count_flops=False)).fit()
    assert counted._telemetry.flops > 0 and plain._telemetry.flops is None
    assert _same(_weights(counted), _weights(plain))


@pytest.mark.parametrize("kept", ["_random_streams_kept", "_modules_kept"])
def test_a_count_that_kept_nothing_would_change_the_run(make_cfg, tmp_path, monkeypatch, kept):
    """The negative control: without the random streams or the buffers kept, the comparison
    above fails."""
    plain = Trainer(0, _norm_cfg(make_cfg, save_dir=str(tmp_path / "b"), count_flops=False)).fit()
    monkeypatch.setattr(flops, kept, lambda *_args: contextlib.nullcontext())
    counted = Trainer(0, _norm_cfg(make_cfg, save_dir=str(tmp_path / "a"))).fit()
    assert not _same(_weights(counted), _weights(plain))


def test_a_model_the_counter_cannot_count_loses_only_its_flops(make_cfg, tmp_path, monkeypatch):
    def unsupported(*_args):
        raise RuntimeError("an operator the counter cannot run")

    monkeypatch.setattr(epochs, "count_step_flops", unsupported)
    with pytest.warns(UserWarning, match="FLOPs not counted") as caught:
        task = Trainer(0, make_cfg(max_epochs=2)).fit()
    assert len([w for w in caught if "FLOPs" in str(w.message)]) == 1
    assert task.engines["trainer"].state.epoch == 2
    rows = _perf(tmp_path / "run")
    assert sorted(rows) == [1, 2]
    assert not [name for row in rows.values() for name in row if "flop" in name]
    assert all("perf/data_wait_share" in row for row in rows.values())


@pytest.mark.parametrize(
    "runner, phrase",
    [
        ("no_targets", "could not resolve path ('targets', 'labels') at 'targets'"),
        ("wrong_keys", "does not accept the model_input keys ['inputs']"),
    ],
)
def test_a_config_mistake_in_the_counting_step_is_the_one_error_no_warning_before_it(
    tmp_path, runner, phrase
):
    """prep_batch returns no targets, or a key forward does not take: the count's step meets it
    first, and says it as the real step would, with no warning that training is unaffected."""
    config = write_toy_config(
        tmp_path / "cfg.py",
        save_dir=str(tmp_path / "run"),
        main_runner=f"tests.toy.bad_trainers.{runner}",
    )
    done = run_gatle("train", f"--config={config}")
    assert done.returncode == 2, done.stderr
    assert "FLOPs not counted" not in done.stderr and "unaffected" not in done.stderr
    assert done.stderr.count(phrase) == 1
    assert "config error: " in done.stderr and "Traceback" not in done.stderr


# ----------------------------------------------------------------------------- data wait


def _train_cli(tmp_path, *extra, **fields):
    fields.setdefault("save_dir", str(tmp_path / "run"))
    fields.setdefault("logger_name", ["text"])
    config = write_toy_config(tmp_path / "toy_cfg.py", **fields)
    return main(["train", "--config", config, *extra])


def test_a_slow_loader_shows_in_the_data_wait_and_the_summary_advises(tmp_path, capsys):
    # 16 batches of 80 ms: more than a second an epoch, far more a batch than a worker costs.
    slow = {"n": 64, "bs": 4, "sleep_s": 0.02, "num_workers": 0}
    assert (
        _train_cli(
            tmp_path, max_epochs=1, train_ds_name="tests.toy.perf_data", train_ds_params=slow
        )
        == 0
    )
    assert _perf(tmp_path / "run")[1]["perf/data_wait_share"] > 0.5
    out = capsys.readouterr().out
    [advice] = [line for line in out.splitlines() if line.startswith("  advice")]
    assert "train_ds_params.num_workers is 0" in advice
    assert "CPU cores" in advice and "--override train_ds_params.num_workers=" in advice
    [spent] = [line for line in out.splitlines() if line.startswith("  time ")]
    assert "training " in spent and "(data wait " in spent and "evaluation " in spent


def test_a_small_wait_that_is_a_large_share_gets_no_advice(tmp_path, capsys):
    """An in-memory loader beside a tiny step: most of the time, yet a tenth of a second an
    epoch, less than starting a worker costs; advising workers would slow the run down."""
    quick = {"n": 16, "bs": 1, "sleep_s": 0.008, "num_workers": 0}
    fields = {"train_ds_name": "tests.toy.perf_data", "train_ds_params": quick}
    assert _train_cli(tmp_path, max_epochs=2, **fields) == 0
    perf = _perf(tmp_path / "run")
    assert all(row["perf/data_wait_share"] > 1 / 3 for row in perf.values())
    out = capsys.readouterr().out
    assert "  time     training " in out and "(data wait " in out
    assert "  advice" not in out


def test_a_loader_that_keeps_up_shows_a_low_share_and_no_advice(tmp_path, capsys):
    """The negative control: the same task and loader, with a step that outweighs a fetch."""
    wide = {"in_dim": 256, "hidden": 1024}
    train = {"n": 256, "bs": 16, "in_dim": 256}
    valid = {"n": 32, "bs": 16, "seed": 1, "in_dim": 256}
    fields = {"model_params": wide, "train_ds_params": train, "valid_ds_params": valid}
    assert _train_cli(tmp_path, max_epochs=1, **fields) == 0
    assert _perf(tmp_path / "run")[1]["perf/data_wait_share"] < 0.5
    out = capsys.readouterr().out
    assert "  time     training " in out and "  speed    " in out
    assert "  advice" not in out


def test_the_advice_names_the_workers_a_loader_already_has():
    from ml_collections import ConfigDict

    from gatle_ignite.cli.time_breakdown import data_wait_advice, usable_cores

    cfg = ConfigDict({"train_ds_params": {"num_workers": 64}})
    advice = data_wait_advice(0.6, cfg)
    assert "waited for its next batch 60% of its time" in advice
    assert "num_workers = 64" in advice and f"{usable_cores()} CPU cores" in advice
    assert "cannot keep up" in advice


def test_the_summary_counts_the_command_from_its_process_start(tmp_path):
    # The process sleeps before the CLI is even imported: its start-up is that slow.
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), max_epochs=1)
    code = (
        "import sys, time\n"
        "time.sleep(8)\n"
        "from gatle_ignite.cli.main import main\n"
        f"sys.argv = ['gatle-ignite', 'train', '--config={config}']\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    headline = next(
        line for line in done.stdout.splitlines() if line.startswith("TRAINING COMPLETE after ")
    )
    assert float(headline.split(", ")[-1].split(" s in this command")[0]) >= 8
    [rest] = [p for p in done.stdout.split(", ") if p.startswith("the rest ")]
    assert float(rest.split()[2]) >= 8


@pytest.fixture
def threads():
    """torch's thread count, restored after the test."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _fit_warnings(make_cfg):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(0, make_cfg(max_epochs=1)).fit()
    return [str(w.message) for w in caught if "threads" in str(w.message)]


def test_threads_beyond_the_free_cores_are_named_once_with_the_fix(make_cfg, threads, monkeypatch):
    cores = usable_cores()
    threads(cores * 4)
    # Other work as busy as every core: the load average the machine would report.
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cores), float(cores), float(cores)))
    [message] = _fit_warnings(make_cfg)
    assert f"torch runs {cores * 4} threads on {cores} usable CPU cores" in message
    assert f"load average of {cores:.1f}" in message
    assert "OMP_NUM_THREADS=1" in message and "torch.set_num_threads(1)" in message


def test_threads_that_fit_the_cores_are_not_named(make_cfg, threads, monkeypatch):
    # The negative control: the same run on an idle machine, one thread.
    threads(1)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert _fit_warnings(make_cfg) == []


def test_several_processes_share_the_cores():
    message = oversubscription(threads=4, processes=2, cores=4, load=0.0)
    assert "2 processes x 4 threads on 4 usable CPU cores" in message
    assert "OMP_NUM_THREADS=2" in message
    assert oversubscription(threads=2, processes=2, cores=4, load=0.0) is None


# ----------------------------------------------------------------------------- the profiler


def _trace(save_dir):
    [path] = (save_dir / "profile").glob("*.pt.trace.json")
    return path, json.loads(path.read_text())


def test_profile_writes_a_trace_that_loads_and_prints_the_top_operators(make_cfg, tmp_path, capsys):
    Trainer(0, make_cfg(max_epochs=2, profile=SHORT_PROFILE)).fit()
    path, trace = _trace(tmp_path / "run")
    # wait 1 and warm up 1 step: iterations 3 and 4 are recorded.
    assert path.name == "rank0_iterations_3-4.pt.trace.json"
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= names
    assert any(name.startswith("aten::") for name in names)
    out = capsys.readouterr().out
    assert f"PROFILE: trace written to {path}" in out and "Top operators by self time" in out


def test_profiling_does_not_change_the_result(make_cfg, tmp_path):
    profiled = Trainer(0, _norm_cfg(make_cfg, save_dir=str(tmp_path / "a"), profile=SHORT_PROFILE))
    profiled.fit()
    plain = Trainer(0, _norm_cfg(make_cfg, save_dir=str(tmp_path / "b"))).fit()
    assert _same(_weights(profiled), _weights(plain))


def test_train_profile_flag_profiles_with_the_default_schedule(tmp_path, capsys):
    # The default schedule waits 5 steps, warms up 2 and records 3: 10 of the 12 iterations.
    assert _train_cli(tmp_path, "--profile", max_epochs=3) == 0
    path, _trace_json = _trace(tmp_path / "run")
    assert path.name == "rank0_iterations_8-10.pt.trace.json"
    assert "profile=True" not in capsys.readouterr().out.split("  resume")[-1]


def test_a_schedule_in_a_config_dict_is_accepted():
    """A config copied to spawned ranks holds the schedule as a ConfigDict, which is no
    Mapping."""
    from ml_collections import ConfigDict

    from gatle_ignite.trainer.telemetry.profiler import profile_schedule

    assert profile_schedule(ConfigDict(SHORT_PROFILE)) == SHORT_PROFILE


def test_a_run_shorter_than_the_schedule_says_there_is_no_trace(make_cfg, tmp_path, capsys):
    Trainer(0, make_cfg(max_epochs=1, profile={"wait": 4, "warmup": 1, "active": 1})).fit()
    assert "PROFILE: no trace" in capsys.readouterr().out
    assert not (tmp_path / "run" / "profile").exists()


def test_replacing_a_run_deletes_its_traces(make_cfg, tmp_path):
    Trainer(0, make_cfg(max_epochs=2, profile=SHORT_PROFILE)).fit()
    assert (tmp_path / "run" / "profile").is_dir()
    Trainer(0, make_cfg(max_epochs=1, replace_run=True)).fit()
    assert not (tmp_path / "run" / "profile").exists()


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"profile": {"wiat": 1}}, "profile must be False, True or a mapping"),
        ({"profile": {"active": 0}}, r"profile\['active'\] must be an int >= 1"),
        ({"profile": "yes"}, "profile must be False, True or a mapping"),
    ],
)
def test_a_bad_telemetry_field_is_a_config_error(make_cfg, fields, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(0, make_cfg(**fields))


# ----------------------------------------------------------------------------- figures


@pytest.mark.parametrize(
    "name, bf16",
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H200", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40S", 362.1),
        ("NVIDIA A10G", None),  # not the A10: unknown, so no MFU rather than a wrong one
        ("Tesla V100-SXM2-16GB", None),  # no bf16 on a V100
    ],
)
def test_the_peak_table_matches_device_names(name, bf16):
    assert peak_tflops_of(name, "bf16") == bf16


def test_the_perf_line_reads_briefly():
    line = perf_line(
        {
            "perf/epoch_time_s": 12.5,
            "perf/train_time_s": 10.0,
            "perf/data_wait_share": 0.04,
            "perf/eval_time_s": 2.0,
            "perf/checkpoint_stall_s": 0.25,
            "perf/samples_per_s": 12345.0,
            "perf/peak_memory_mb": 20480.0,
            "perf/achieved_tflops": 405.3,
            "perf/mfu": 0.4097,
        }
    )
    assert line == (
        "epoch 12.5 s | train 10 s (data wait 4%), eval 2 s, checkpoint 0.25 s | "
        "12.3k samples/s | peak 20,480 MB | 405 TFLOP/s, MFU 41.0%"
    )


@pytest.mark.parametrize(
    "tflops, mfu, shown",
    [
        (4.41e-05, None, None),
        (0.5, None, "0.5 TFLOP/s"),
        (0.002, 0.0001, "0.002 TFLOP/s, MFU 0.0%"),
    ],
    ids=["a small model on the CPU", "a large one on the CPU", "any on a known GPU"],
)
def test_achieved_tflops_show_beside_an_mfu_or_from_ten_gflops(tflops, mfu, shown):
    record = {"perf/epoch_time_s": 1.0, "perf/achieved_tflops": tflops}
    if mfu is not None:
        record["perf/mfu"] = mfu
    line = perf_line(record)
    assert line.endswith(f" | {shown}") if shown else "TFLOP" not in line


def test_the_summary_of_a_cpu_run_shows_no_tflops(tmp_path, capsys):
    assert _train_cli(tmp_path, max_epochs=1) == 0
    out = capsys.readouterr().out
    [speed] = [line for line in out.splitlines() if line.startswith("  speed ")]
    assert "samples/s" in speed and "TFLOP/s" not in speed
    assert "TFLOP/s" not in out


# ----------------------------------------------------------------------------- several ranks

GLOO = ["--override=dist_backend='gloo'", "--override=auto_model_params.sync_bn=False"]


def _two_ranks(tmp_path, name, *overrides):
    save_dir = tmp_path / name
    fields = {"save_dir": str(save_dir), "max_epochs": 2, "logger_name": ["text"]}
    config = write_toy_config(tmp_path / f"{name}.py", **fields)
    done = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"]
        + ["--override=nproc_per_node=2", *GLOO, *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=child_env(OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return save_dir, done.stdout


@pytest.mark.slow
def test_two_ranks_log_once_count_their_share_and_train_the_same(tmp_path):
    save_dir, out = _two_ranks(tmp_path, "counted")
    rows = _perf(save_dir)
    assert sorted(rows) == [1, 2] and all(set(EVERY_EPOCH) <= set(r) for r in rows.values())
    # Each rank counts its own half of the batch of 16.
    assert rows[1]["perf/flops_per_step"] == _mlp_flops(batch=8)
    # bs is the total batch: 64 samples an epoch over both ranks.
    assert rows[1]["perf/samples_per_s"] == pytest.approx(64 / rows[1]["perf/train_time_s"])
    assert out.count("\nperf   epoch ") == 2
    plain_dir, _out = _two_ranks(tmp_path, "plain", "--override=count_flops=False")
    counted = torch.load(find_latest_checkpoint(save_dir), weights_only=True)["model"]
    plain = torch.load(find_latest_checkpoint(plain_dir), weights_only=True)["model"]
    assert _same(counted, plain)


@pytest.mark.slow
def test_fsdp_ranks_count_flops_and_profile(tmp_path):
    config = ROOT / "examples" / "sharded_lm" / "configs" / "sharded_lm_v0.py"
    save_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={config}"]
        + ["--override=max_epochs=1", "--override=train_length=8", "--override=val_length=2"]
        + [f"--override=save_dir={str(save_dir)!r}", f"--override=profile={SHORT_PROFILE!r}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=child_env(OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "FLOPs not counted" not in done.stderr
    row = _perf(save_dir)[1]
    assert row["perf/flops_per_step"] > 0 and row["perf/tokens_per_s"] > 0
    traces = sorted(p.name for p in (save_dir / "profile").glob("*.pt.trace.json"))
    assert traces == [f"rank{r}_iterations_3-4.pt.trace.json" for r in (0, 1)]
    assert os.path.getsize(save_dir / "profile" / traces[0]) > 0
