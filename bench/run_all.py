"""Every benchmark, then one summary table with PASS/FAIL against each target.

    python -m bench.run_all [--reps N] [--only train,eval,...] [--markdown PATH]

Run from the repository root. ``--reps`` overrides each benchmark's own repetition count;
``--markdown`` also writes the whole report (machine, figures, summary) to PATH. With
GATLE_BENCH_BASELINE=<an older checkout>/src, train, reads and ddp also measure that code.
"""

import argparse
import importlib
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from bench import common

BENCHMARKS = {
    "train": "bench.train_step",
    "eval": "bench.eval_step",
    "reads": "bench.reads",
    "ablate": "bench.ablate",
    "startup": "bench.startup",
    "checkpoint": "bench.checkpoint",
    "resume": "bench.resume",
    "ddp": "bench.ddp",
    "fsdp": "bench.fsdp",
    "cuda": "bench.cuda",
    "sweep": "bench.sweep",
    "budget": "bench.budget",
}


def _cpu_model():
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown CPU"


def source():
    """The commit measured, and which files under src/ differed from it."""
    commit = common.git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = common.git("status", "--short", "--", "src").splitlines()
    changed = ", ".join(line[3:] for line in dirty) if dirty else "none"
    baseline = common.baseline_commit()
    against = f"; baseline {baseline} ({os.environ[common.BASELINE_ENV]})" if baseline else ""
    return f"gatle-ignite at commit {commit}; uncommitted changes under src/: {changed}{against}"


def machine():
    """The lines that say what these figures were measured on."""
    import ignite
    import torch

    import gatle_ignite

    return [
        f"{_cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at start",
        f"Python {platform.python_version()}, torch {torch.__version__}, pytorch-ignite "
        f"{ignite.__version__}, gatle-ignite {gatle_ignite.__version__}",
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
            text, found = module.run(args.reps)
        except Exception as error:
            # One crashed benchmark must not throw away the figures of the others.
            traceback.print_exc()
            reason = str(error).strip().splitlines()[-1][:120]
            text, found = f"ERROR: {reason}", [common.unmeasured(name, "ERROR", reason)]
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
