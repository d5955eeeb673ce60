"""Full runs of every shipped example, then each example's own checks; one summary at the end.

    python scripts/run_examples.py                 # all of them (several minutes on a CPU)
    python scripts/run_examples.py synthetic gan   # some of them
    python scripts/run_examples.py --jobs 2        # two examples at a time (CI, 2 cores)

Each example starts from an empty ``examples/<name>/checkpoints/`` (its previous runs are
deleted), trains its full config, and runs its ``scripts/`` checks, with one torch thread, which
is the fastest setting on a small shared CPU. With ``--jobs N`` N examples run at once, each
one's output printed whole when it ends. Exits 0 only when every step of every example passed.
"""

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "gatle_ignite", "train"]


def _train(example, config=None, *overrides, env=None):
    config = config or f"{example}_v0"
    command = [*TRAIN, f"--config=examples/{example}/configs/{config}.py"]
    return (command + [f"--override={o}" for o in overrides], env or {})


def _check(example, script, *args):
    return ([sys.executable, "-m", f"examples.{example}.scripts.{script}", *args], {})


# The longest first (on a 2-core CPU), so that examples run at once finish close together.
STEPS = {
    "causal_lm": [_train("causal_lm"), _check("causal_lm", "checks")],
    "sharded_lm": [_train("sharded_lm"), _check("sharded_lm", "checks")],
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
    "diffusion": [_train("diffusion"), _check("diffusion", "check_sampling")],
    "classification": [
        _train("classification"),
        _train("classification", env={"SHAPES_NO_SAMPLER": "1"}),
        _check("classification", "checks"),
    ],
    "translation": [
        _check("translation", "metric_checks"),
        _train("translation"),
        _check("translation", "checks"),
    ],
    "digits": [_train("digits"), _check("digits", "checks")],
    "resnet_digits": [_train("resnet_digits"), _check("resnet_digits", "checks")],
    "gan": [_train("gan"), _check("gan", "verify")],
    "contrastive": [_train("contrastive"), _check("contrastive", "probe_check")],
    "ema": [_train("ema"), _check("ema", "verify")],
    "templates": [_train("templates"), _check("templates", "checks")],
    "synthetic": [_check("synthetic", "checks")],
}


_PRINTING = threading.Lock()


def run_example(name, quiet=False):
    """Train and check one example; ``quiet`` holds its output back and prints it whole at the
    end, so that examples running at once do not interleave."""
    shutil.rmtree(ROOT / "examples" / name / "checkpoints", ignore_errors=True)
    started, said, passed = time.monotonic(), [], True
    for command, extra_env in STEPS[name]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", **extra_env}
        shown = " ".join(f"{k}={v}" for k, v in extra_env.items()) + " " + " ".join(command[1:])
        said.append(f"\n>>> [{name}] {shown.strip()}\n")
        if not quiet:
            print(said.pop(), end="", flush=True)
        output = subprocess.PIPE if quiet else None
        done = subprocess.run(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, text=True
        )
        said.append(done.stdout or "")
        if done.returncode != 0:
            passed = False
            break
    if quiet:
        with _PRINTING:
            print("".join(said), end="", flush=True)
    return passed, time.monotonic() - started


def main(argv) -> int:
    parser = argparse.ArgumentParser(description="Full runs and checks of the shipped examples.")
    parser.add_argument("names", nargs="*", help="examples to run (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="examples run at once (default 1)")
    args = parser.parse_args(argv)
    names = args.names or list(STEPS)
    unknown = sorted(set(names) - set(STEPS))
    if unknown:
        print(f"unknown example(s) {unknown}; choose from {sorted(STEPS)}")
        return 2
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        ran = pool.map(lambda name: run_example(name, quiet=args.jobs > 1), names)
        results = dict(zip(names, ran))
    print("\nexample            result  seconds")
    for name, (passed, seconds) in results.items():
        print(f"{name:<18} {'PASS' if passed else 'FAIL':<7} {seconds:7.1f}")
    failed = sum(not passed for passed, _ in results.values())
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
