"""Sweeps that train: trials as runs, pruning, failures, preemption, killed workers, parallel
workers on the default storage and on a real PostgreSQL, and a DDP trial.

Every sweep here runs the CLI as a user would (`python -m gatle_ignite sweep ...`) and is
checked through what it leaves: the study, each trial's run.json and weights, and its output.
"""

import csv
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from gatle_ignite.trainer.preemption import EXIT_PREEMPTED
from tests.conftest import HANG_S, ROOT, child_env

optuna = pytest.importorskip("optuna", reason="the sweep extra is not installed")

pytestmark = pytest.mark.slow

GOOD_LR, BAD_LR = 0.05, 1e-9
FIELDS = {"main_runner": "tests.toy.dist_trainer", "max_epochs": 3, "verbosity": 1}
GLOO = ["--override=dist_backend=gloo", "--override=auto_model_params.sync_bn=False"]


def _config(tmp_path, **fields):
    fields = {**FIELDS, "save_dir": str(tmp_path / "by_hand"), **fields}
    path = tmp_path / "toy_cfg.py"
    path.write_text(
        "from tests.toy.config import toy_config\n\n\n"
        f"def get_config():\n    return toy_config(**{fields!r})\n"
    )
    return path


def _sweep_file(tmp_path, **fields):
    path = tmp_path / "toy_sweep.py"
    path.write_text(f"def get_sweep():\n    return {fields!r}\n")
    return path


def _argv(config, sweep_dir, *args):
    command = [sys.executable, "-m", "gatle_ignite", "sweep", f"--config={config}"]
    return [*command, "--dir", str(sweep_dir), *args]


def _ran(argv, expect=0, env=None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=env or child_env()
    )
    assert done.returncode == expect, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def _run(argv, expect=0, env=None):
    return _ran(argv, expect, env).stdout


def _start(argv, env=None):
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env or child_env(),
    )


def _read_until(process, pattern, seen=None):
    """Read the sweep's output until a line matches ``pattern``; returns the lines read."""
    lines = [] if seen is None else seen
    for line in process.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"no line matched {pattern!r}:\n" + "".join(lines[-40:]))


def _study(sweep_dir, storage=None):
    record = json.loads((sweep_dir / "sweep.json").read_text())
    if storage is None:
        from optuna.storages.journal import JournalFileBackend

        storage = optuna.storages.JournalStorage(
            JournalFileBackend(str(sweep_dir / "study.journal"))
        )
    return optuna.load_study(study_name=record["study"], storage=storage)


def _states(study) -> list:
    return [(t.number, t.state.name) for t in study.get_trials()]


def _trial_dir(sweep_dir, number):
    return sweep_dir / f"trial_{number:04d}"


def _manifest(trial_dir) -> dict:
    return json.loads((trial_dir / "run.json").read_text())


def _weights(run_dir):
    return torch.load(run_dir / "final_weights.pt", weights_only=True)


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])]


def _count(out: str, text: str) -> int:
    return sum(line.startswith(text) for line in out.splitlines())


def test_a_sweep_finishes_n_trials_each_a_run_of_its_parameters(tmp_path):
    config, sweep_dir = _config(tmp_path, max_epochs=2), tmp_path / "sweep"
    args = [
        "--trials=3",
        "--sampler=random",
        "--param=optimizer_params.lr=[0.003, 0.03]",
        "--param=model_params.hidden=int(4, 16)",
    ]
    out = _run(_argv(config, sweep_dir, *args))
    study = _study(sweep_dir)
    assert _states(study) == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    for trial in study.get_trials():
        manifest = _manifest(_trial_dir(sweep_dir, trial.number))
        assert manifest["state"] == "completed"
        assert manifest["sweep"]["trial"] == trial.number
        assert manifest["sweep"]["params"] == trial.params
        assert manifest["config"]["optimizer_params"]["lr"] == trial.params["optimizer_params.lr"]
        assert manifest["config"]["model_params"]["hidden"] == trial.params["model_params.hidden"]
        # The trial's score is its run's best checkpoint's.
        best = max(e["score"] for e in manifest["checkpoints"] if e["kind"] == "best")
        assert trial.value == pytest.approx(best)
    best = study.best_trial
    assert f"BEST: trial {best.number}, valid/acc {best.value:.5g}" in out
    assert f"  run:      {_trial_dir(sweep_dir, best.number)}" in out
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["params"] == {
        "optimizer_params.lr": "[0.003, 0.03]",
        "model_params.hidden": "int(4, 16)",
    }
    assert (record["metric"], record["direction"], record["trials"]) == ("valid/acc", "maximize", 3)
    # `runs` over the sweep: one row per trial, the best first, its score the study's best.
    table = _run([sys.executable, "-m", "gatle_ignite", "runs", str(sweep_dir), "--csv"])
    rows = list(csv.DictReader(io.StringIO(table)))
    # A trial is named with its sweep: the study, named after the sweep's directory.
    assert len(rows) == 3 and rows[0]["run"] == f"sweep/trial {best.number}"
    assert float(rows[0]["score"]) == pytest.approx(best.value, abs=1e-4)

    # The same command asking for one more trial runs only that one.
    more = _run(_argv(config, sweep_dir, *[a for a in args if a != "--trials=3"], "--trials=4"))
    assert _count(more, "trial ") == 2  # started, complete
    assert _count(more, "trial 3 started") == 1
    assert [n for n, state in _states(_study(sweep_dir)) if state == "COMPLETE"] == [0, 1, 2, 3]


def test_a_lower_is_better_sweep_names_its_best_by_the_metrics_own_value(tmp_path):
    loss = {"loss": {"cls_name": "gatle_ignite.metrics.loss", "params": {"tgt_name": "labels"}}}
    fields = {"val_metrics": loss, "score_name": "valid/loss", "score_mode": "min"}
    config, sweep_dir = _config(tmp_path, max_epochs=1, **fields), tmp_path / "sweep"
    out = _run(_argv(config, sweep_dir, "--trials=2", "--param=optimizer_params.lr=[0.001, 0.05]"))
    best = _study(sweep_dir).best_trial
    assert best.value > 0  # the loss itself, not score_factor x loss
    assert f"BEST: trial {best.number}, valid/loss {best.value:.5g} (lower is better)" in out


def test_pruning_stops_a_trial_clearly_behind_after_its_checkpoint(tmp_path):
    config, sweep_dir = _config(tmp_path, max_epochs=4), tmp_path / "sweep"
    sweep_file = _sweep_file(
        tmp_path,
        config=str(config),
        dir=str(sweep_dir),
        trials=3,
        params={"optimizer_params.lr": "loguniform(1e-9, 0.1)"},
        pruner="median",
        pruner_params={"n_startup_trials": 2},
        enqueue=[{"optimizer_params.lr": lr} for lr in (GOOD_LR, GOOD_LR, BAD_LR)],
    )
    out = _run([sys.executable, "-m", "gatle_ignite", "sweep", f"--sweep={sweep_file}"])
    assert _states(_study(sweep_dir)) == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "PRUNED")]
    assert "trial 2 pruned (after epoch 1, valid/acc" in out
    pruned = _trial_dir(sweep_dir, 2)
    manifest = _manifest(pruned)
    assert (manifest["state"], manifest["trained_epoch"]) == ("pruned", 1)
    assert [e["file"] for e in manifest["checkpoints"] if e["kind"] == "latest_epoch"] == [
        "latest_epoch_checkpoint_1.pt"
    ]
    assert _manifest(_trial_dir(sweep_dir, 0))["trained_epoch"] == 4
    status = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "status", str(pruned)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_env(),
    )
    assert status.returncode == 0 and "state:    pruned (after epoch 1" in status.stdout
    # A pruned trial is finished: its own command with resume=True does nothing.
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "gatle_ignite",
            "train",
            f"--config={config}",
            f"--override=save_dir={pruned}",
            f"--override=optimizer_params.lr={BAD_LR!r}",
            "--override=resume=True",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=HANG_S,
    )
    assert again.returncode == 0, again.stderr
    assert "NOTHING TO DO" in again.stdout and "was pruned by its sweep" in again.stdout


def test_diverged_trials_fail_in_the_study_and_never_stop_the_sweep(tmp_path):
    config = _config(tmp_path, max_epochs=1, fault_nan_rank=0, fault_nan_from=10**6)
    sweep_dir = tmp_path / "sweep"
    sweep_file = _sweep_file(
        tmp_path,
        trials=3,
        params={"fault_nan_from": [1, 10**6]},
        enqueue=[{"fault_nan_from": 1}, {"fault_nan_from": 1}, {"fault_nan_from": 10**6}],
        # A diverged trial is an outcome of its values, not a failure of the sweep's setup.
        max_failures=1,
    )
    out = _run(_argv(config, sweep_dir, f"--sweep={sweep_file}"))
    study = _study(sweep_dir)
    assert _states(study) == [(0, "FAIL"), (1, "FAIL"), (2, "COMPLETE")]
    reason = study.trials[0].user_attrs["fail_reason"]
    assert reason == "diverged: non-finite loss at iteration 1"
    assert "trial 0 diverged (non-finite loss at iteration 1): a failed trial in the study" in out
    assert "[trial_0000] TRAINING DIVERGED (non-finite loss at iteration 1)" in out
    assert _manifest(_trial_dir(sweep_dir, 0))["state"] == "diverged"


def _one_trial_sweep(tmp_path, until, iter_sleep_s=0.15):
    """A sweep of one trial of slow iterations, started and read until a line matches ``until``:
    ``(its argv, its process, its directory, the lines read)``."""
    config = _config(tmp_path, iter_sleep_s=iter_sleep_s)
    sweep_dir = tmp_path / "sweep"
    argv = _argv(config, sweep_dir, "--trials=1", f"--param=optimizer_params.lr=[{GOOD_LR}]")
    sweep = _start(argv)
    return argv, sweep, sweep_dir, _read_until(sweep, until)


def test_a_trial_killed_by_sigkill_is_failed_in_the_study_and_in_its_status_alike(tmp_path):
    _, sweep, sweep_dir, seen = _one_trial_sweep(
        tmp_path, r"^\[trial_0000\] .* TRAIN epoch 1: 2/4", iter_sleep_s=0.3
    )
    trial_dir = _trial_dir(sweep_dir, 0)
    # The trial's own process, as the OOM killer would end it; the sweep lives on.
    holder = json.loads((trial_dir / "run.lock").read_text())
    os.kill(holder["pid"], signal.SIGKILL)
    out = "".join(seen) + sweep.communicate(timeout=HANG_S)[0]
    assert sweep.returncode == 1, out[-3000:]
    assert "trial 0 failed: killed by SIGKILL" in out
    assert _states(_study(sweep_dir)) == [(0, "FAIL")]
    # status agrees with the study: failed (exit 1), not interrupted and resumable (75).
    status = _ran([sys.executable, "-m", "gatle_ignite", "status", str(trial_dir)], expect=1)
    assert "state:    failed (killed by SIGKILL; its sweep recorded the trial failed)" in (
        status.stdout
    )


def test_a_sweep_whose_trials_keep_failing_stops_with_the_reason(tmp_path):
    config = _config(tmp_path, max_epochs=1, fault_crash_rank=0, fault_crash_at=2)
    sweep_dir = tmp_path / "sweep"
    args = ["--trials=5", "--param=optimizer_params.lr=[0.01, 0.02]", "--max-failures=2"]
    done = _ran(_argv(config, sweep_dir, *args), expect=1)
    study = _study(sweep_dir)
    assert _states(study) == [(0, "FAIL"), (1, "FAIL")]
    reason = "RuntimeError: injected crash on rank 0 at iteration 2"
    assert all(reason in t.user_attrs["fail_reason"] for t in study.trials)
    stopped = "SWEEP STOPPED: 2 trials in a row failed (--max-failures 2); the last, trial 1"
    assert stopped in done.stderr and stopped not in done.stdout


def test_a_sigtermed_sweep_resumes_the_interrupted_trial_exactly(tmp_path):
    argv, sweep, sweep_dir, seen = _one_trial_sweep(
        tmp_path, r"^\[trial_0000\] .* TRAIN epoch 2: 2/4"
    )
    run_id = _manifest(_trial_dir(sweep_dir, 0))["run_id"]
    sweep.send_signal(signal.SIGTERM)
    out = "".join(seen) + sweep.communicate(timeout=HANG_S)[0]
    assert sweep.returncode == EXIT_PREEMPTED, out[-3000:]
    assert "trial 0 preempted: resumable" in out and "PREEMPTED (stopped by SIGTERM)" in out
    assert _states(_study(sweep_dir)) == [(0, "RUNNING")]
    assert _manifest(_trial_dir(sweep_dir, 0))["state"] == "preempted"

    out = _run(argv)
    assert _count(out, "trial 0 resumed") == 1 and _count(out, "trial 0 started") == 0
    assert "[trial_0000] RESUMING FROM:" in out
    assert _states(_study(sweep_dir)) == [(0, "COMPLETE")]
    manifest = _manifest(_trial_dir(sweep_dir, 0))
    assert (manifest["run_id"], manifest["state"]) == (run_id, "completed")
    # The command the sweep prints to train the best trial again, run by hand, never
    # interrupted, ends on the same weights.
    again = out.split("train it again as a config: ")[1].splitlines()[0]
    by_hand = shlex.split(again)
    assert by_hand[:2] == ["gatle-ignite", "train"]
    # Named after the trial, so that a config whose save_dir follows its name trains beside it.
    assert any(word.startswith("name=") and word.endswith("_trial_0") for word in by_hand)
    subprocess.run(
        [sys.executable, "-m", "gatle_ignite", *by_hand[1:]],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env=child_env(),
        timeout=HANG_S,
    )
    _assert_identical(_weights(tmp_path / "by_hand"), _weights(_trial_dir(sweep_dir, 0)))


def test_ctrl_c_stops_a_sweep_as_a_preemption_not_a_failure(tmp_path):
    """A trial takes SIGINT as an error; the sweep passes a terminal's Ctrl-C on as SIGTERM."""
    _, sweep, sweep_dir, seen = _one_trial_sweep(tmp_path, r"^\[trial_0000\] .* TRAIN epoch 1: 2/4")
    sweep.send_signal(signal.SIGINT)
    out = "".join(seen) + sweep.communicate(timeout=HANG_S)[0]
    assert sweep.returncode == EXIT_PREEMPTED, out[-3000:]
    assert "PREEMPTED (stopped by SIGINT)" in out
    assert "[trial_0000] PREEMPTED by SIGTERM after iteration" in out
    assert _states(_study(sweep_dir)) == [(0, "RUNNING")]
    assert _manifest(_trial_dir(sweep_dir, 0))["state"] == "preempted"


class Output:
    """A process's output, read in a thread as it comes."""

    def __init__(self, process):
        self.process = process
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)

    def has(self, pattern) -> bool:
        return any(re.search(pattern, line) for line in list(self.lines))

    def text(self) -> str:
        self._reader.join(timeout=HANG_S)
        return "".join(self.lines)


def _wait_for(condition, what):
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def test_a_sigkilled_workers_trial_is_finished_by_another_worker(tmp_path):
    config = _config(tmp_path, iter_sleep_s=0.3, max_epochs=4, save_every_iters=1)
    sweep_dir = tmp_path / "sweep"
    argv = _argv(config, sweep_dir, "--trials=2", f"--param=optimizer_params.lr=[{GOOD_LR}]")
    outputs = [Output(_start(argv)), Output(_start(argv))]
    _wait_for(lambda: all(o.has(r"^trial \d started") for o in outputs), "both trials started")
    (victim,) = [o for o in outputs if o.has(r"^trial 0 started")]
    (other,) = [o for o in outputs if o is not victim]
    _wait_for(lambda: victim.has(r"^\[trial_0000\] .* TRAIN epoch 1: 2/4"), "trial 0 training")
    run_id = _manifest(_trial_dir(sweep_dir, 0))["run_id"]
    victim.process.kill()  # the worker only: its trial is left behind, then orphaned
    victim.process.wait(timeout=HANG_S)
    assert other.process.wait(timeout=HANG_S) == 0, other.text()[-3000:]
    out = victim.text() + other.text()
    assert _count(out, "trial 0 started") == 1 and _count(out, "trial 1 started") == 1
    assert _count(other.text(), "trial 0 resumed") == 1
    assert _states(_study(sweep_dir)) == [(0, "COMPLETE"), (1, "COMPLETE")]
    assert _manifest(_trial_dir(sweep_dir, 0))["run_id"] == run_id
    # Both trials had the same parameters; the interrupted one ends where the other did.
    _assert_identical(_weights(_trial_dir(sweep_dir, 1)), _weights(_trial_dir(sweep_dir, 0)))


def test_two_workers_run_two_trials_at_once_each_on_its_share_of_the_cores(tmp_path):
    config = _config(tmp_path, iter_sleep_s=0.1)
    sweep_dir = tmp_path / "sweep"
    args = ["--trials=4", "--workers=2", f"--param=optimizer_params.lr=[{GOOD_LR}, 0.02]"]
    env = child_env(GATLE_IGNITE_CPUS="2")
    env.pop("OMP_NUM_THREADS", None)
    out = _run(_argv(config, sweep_dir, *args), env=env)
    assert _states(_study(sweep_dir)) == [(n, "COMPLETE") for n in range(4)]
    assert all(_count(out, f"trial {n} started") == 1 for n in range(4))
    lines = [line for line in out.splitlines() if line.startswith("trial ")]
    assert {lines[0].split()[1], lines[1].split()[1]} == {"0", "1"}, "the first two ran at once"
    for number in range(4):
        probe = json.loads((_trial_dir(sweep_dir, number) / "probe_rank0.json").read_text())
        assert probe["threads"] == 1  # each of 2 workers got 1 of the 2 cores


def test_two_sweeps_sharing_a_postgresql_study_never_run_a_trial_twice(tmp_path, postgres):
    url = postgres.create_database("sweeps")
    # With a password in it (the server trusts local connections): it is shown nowhere.
    url = url.replace(f"//{postgres.user}@", f"//{postgres.user}:hunter2@")
    config, sweep_dir = _config(tmp_path, max_epochs=2), tmp_path / "sweep"
    argv = _argv(
        config,
        sweep_dir,
        "--trials=4",
        f"--storage={url}",
        "--param=optimizer_params.lr=[0.02, 0.05]",
    )
    sweeps = [_start(argv), _start(argv)]
    outs = [process.communicate(timeout=HANG_S)[0] for process in sweeps]
    assert [process.returncode for process in sweeps] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    out = "".join(outs)
    assert all(_count(out, f"trial {n} started") == 1 for n in range(4))
    assert _count(out, "trial 4") == 0 and "resumed" not in out
    storage = optuna.storages.RDBStorage(url.replace("postgresql://", "postgresql+psycopg://"))
    assert _states(_study(sweep_dir, storage)) == [(n, "COMPLETE") for n in range(4)]
    written = [sweep_dir / "sweep.json", *sweep_dir.glob("trial_*/run.json")]
    assert "hunter2" not in out and not any("hunter2" in p.read_text() for p in written)
    assert "postgresql+psycopg://<redacted>@/sweeps" in (sweep_dir / "sweep.json").read_text()


_OPEN_AT_ONCE = """
import pathlib, sys, time
import sqlalchemy, optuna.storages
from gatle_ignite.sweep.study import open_storage
url, folder, index = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
(folder / f"ready-{index}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
open_storage({"url": url})
print("opened")
"""


def test_workers_opening_a_fresh_postgresql_database_at_once_all_get_the_study(tmp_path, postgres):
    """N nodes started together find no tables yet; each creates them, and all must succeed."""
    url = postgres.create_database("fresh").replace("postgresql://", "postgresql+psycopg://")
    count = 6
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AT_ONCE, url, str(tmp_path), str(index)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(),
        )
        for index in range(count)
    ]
    _wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == count, "every process ready")
    (tmp_path / "go").touch()
    outs = [process.communicate(timeout=HANG_S)[0] for process in processes]
    assert [process.returncode for process in processes] == [0] * count, "".join(outs)


def test_a_ddp_trial_trains_one_parameter_set_on_both_ranks_and_prunes_on_both(tmp_path):
    config, sweep_dir = _config(tmp_path, max_epochs=3), tmp_path / "sweep"
    sweep_file = _sweep_file(
        tmp_path,
        trials=2,
        params={"optimizer_params.lr": "loguniform(1e-9, 0.1)"},
        overrides={"nproc_per_node": 2},
        pruner_params={"n_startup_trials": 1},
        enqueue=[{"optimizer_params.lr": GOOD_LR}, {"optimizer_params.lr": BAD_LR}],
    )
    out = _run(_argv(config, sweep_dir, f"--sweep={sweep_file}", *GLOO))
    assert _states(_study(sweep_dir)) == [(0, "COMPLETE"), (1, "PRUNED")]
    for number, lr, epochs in ((0, GOOD_LR, 3), (1, BAD_LR, 1)):
        probes = [
            json.loads((_trial_dir(sweep_dir, number) / f"probe_rank{rank}.json").read_text())
            for rank in (0, 1)
        ]
        assert [(p["world_size"], p["lr"], p["epoch"]) for p in probes] == [(2, lr, epochs)] * 2
    assert "trial 1 pruned (after epoch 1" in out
