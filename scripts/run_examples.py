"""Full runs of every shipped example, then each example's own checks; one summary at the end.

    python scripts/run_examples.py                 # all of them (several minutes on a CPU)
    python scripts/run_examples.py synthetic gan   # some of them

Each example starts from an empty ``examples/<name>/checkpoints/`` (its previous runs are
deleted), trains its full config, and runs its ``scripts/`` checks, with one torch thread, which
is the fastest setting on a small shared CPU. Exits 0 only when every step of every example
passed.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "gatle_ignite", "train"]


def _train(example, config=None, *overrides, env=None):
    config = config or f"{example}_v0"
    command = [*TRAIN, f"--config=examples/{example}/configs/{config}.py"]
    return (command + [f"--override={o}" for o in overrides], env or {})


def _check(example, script, *args):
    return ([sys.executable, "-m", f"examples.{example}.scripts.{script}", *args], {})


STEPS = {
    "synthetic": [_check("synthetic", "checks")],
    "classification": [
        _train("classification"),
        _train("classification", env={"SHAPES_NO_SAMPLER": "1"}),
        _check("classification", "checks"),
    ],
    "contrastive": [_train("contrastive"), _check("contrastive", "probe_check")],
    "diffusion": [_train("diffusion"), _check("diffusion", "check_sampling")],
    "ema": [_train("ema"), _check("ema", "verify")],
    "gan": [_train("gan"), _check("gan", "verify")],
    "digits": [_train("digits"), _check("digits", "checks")],
    "teacher_student": [
        _train("teacher_student"),
        _train(
            "teacher_student",
            None,
            "criterion_params.dict_of_loss_params.kd.weight=0.0",
            "save_dir='examples/teacher_student/checkpoints/student_ce'",
        ),
        _check("teacher_student", "verify"),
        _check("teacher_student", "negative_controls"),
    ],
    "translation": [
        _check("translation", "metric_checks"),
        _train("translation"),
        _check("translation", "checks"),
    ],
    "templates": [_train("templates"), _check("templates", "checks")],
    "sharded_lm": [_train("sharded_lm"), _check("sharded_lm", "checks")],
}


def run_example(name):
    shutil.rmtree(ROOT / "examples" / name / "checkpoints", ignore_errors=True)
    started = time.monotonic()
    for command, extra_env in STEPS[name]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", **extra_env}
        shown = " ".join(f"{k}={v}" for k, v in extra_env.items()) + " " + " ".join(command[1:])
        print(f"\n>>> [{name}] {shown.strip()}", flush=True)
        if subprocess.run(command, cwd=ROOT, env=env).returncode != 0:
            return False, time.monotonic() - started
    return True, time.monotonic() - started


def main(names) -> int:
    unknown = sorted(set(names) - set(STEPS))
    if unknown:
        print(f"unknown example(s) {unknown}; choose from {sorted(STEPS)}")
        return 2
    results = {name: run_example(name) for name in names or STEPS}
    print("\nexample            result  seconds")
    for name, (passed, seconds) in results.items():
        print(f"{name:<18} {'PASS' if passed else 'FAIL':<7} {seconds:7.1f}")
    failed = sum(not passed for passed, _ in results.values())
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
