"""Every benchmark, then one summary table with PASS/FAIL against each target of issue 6.

    python -m bench.run_all [--reps N] [--only train,eval,...] [--markdown PATH]

Run from the repository root. ``--reps`` overrides each benchmark's own repetition count;
``--markdown`` also writes the whole report (machine, figures, summary) to PATH.
"""

import argparse
import importlib
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench import common

BENCHMARKS = {
    "train": "bench.train_step",
    "eval": "bench.eval_step",
    "startup": "bench.startup",
    "checkpoint": "bench.checkpoint",
    "ddp": "bench.ddp",
    "cuda": "bench.cuda",
}


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "not installed"


def source():
    """The commit measured, and which files under src/ differed from it."""

    def git(*args):
        proc = subprocess.run(["git", *args], cwd=common.ROOT, capture_output=True, text=True)
        return proc.stdout.rstrip() if proc.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--short", "--", "src").splitlines()
    changed = ", ".join(line[3:] for line in dirty) if dirty else "none"
    return f"gatle-ignite at commit {commit}; uncommitted changes under src/: {changed}"


def machine():
    """The lines that say what these figures were measured on."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return [
        f"{_cpu_model()}, {os.cpu_count()} cores; load average {load:.1f} at start",
        f"Python {platform.python_version()}, torch {_version('torch')}, "
        f"pytorch-ignite {_version('pytorch-ignite')}, lightning {_version('lightning')}, "
        f"gatle-ignite {_version('gatle-ignite')}",
        "one torch thread per process (OMP_NUM_THREADS=1, torch.set_num_threads(1))",
        source(),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, help="repetitions for every benchmark")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    parser.add_argument("--markdown", help="also write the report to this file")
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else list(BENCHMARKS)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")

    header = machine()
    print("\n".join(header), end="\n\n")
    sections, checks = [], []
    started = time.perf_counter()
    for name in chosen:
        module = importlib.import_module(BENCHMARKS[name])
        try:
            text, found = module.run() if args.reps is None else module.run(args.reps)
        except Exception as error:
            # One crashed benchmark must not throw away the figures of the others.
            traceback.print_exc()
            reason = str(error).strip().splitlines()[-1][:120]
            text, found = f"ERROR: {reason}", [common.Check(name, float("nan"), None, error=reason)]
        sections.append(f"### {name}\n\n{text}")
        checks.extend(found)
        print()
    minutes = (time.perf_counter() - started) / 60
    summary = common.checks_table(checks)
    print(f"== summary ({minutes:.1f} min) ==")
    print(summary)
    if args.markdown:
        command = " ".join(["python -m bench.run_all", *sys.argv[1:]])
        lines = [f"Command: `{command}`", "", *[f"- {line}" for line in header], ""]
        report = "\n".join(lines) + "\n" + "\n\n".join(sections)
        report += f"\n\n### summary\n\n{summary}\n"
        Path(args.markdown).write_text(report)
    failed = [c for c in checks if c.status in ("FAIL", "ERROR")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
