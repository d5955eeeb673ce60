"""A run directory on object storage: what metrics.csv and checkpoint uploads cost.

    python -m bench.object_store [--reps 3] [--epochs 6]

Against moto's S3 server on this machine (started and stopped here; needs the dev extra), so
the figures are this machine's CPU and loopback, not a cloud's network: a real endpoint adds
its round trip (tens of ms) to every request and its bandwidth to every byte.

1. metrics.csv: the file is published whole with every run.json update (each checkpoint) and
   at the end. For files of growing size, the time of one whole upload, against uploading only
   the rows one epoch adds as a part object of its own (the alternative, which readers would
   have to join).
2. The loop's stall per epoch for its checkpoint (``perf/checkpoint_stall_s``), a 4 M parameter
   MLP with AdamW (~50 MB file): a local save_dir, s3:// written in the loop, and s3:// with
   ``async_save=True``, where the upload overlaps the next epoch's training.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

ROW = b"1796423312.325,3,96,train/loss,0.8382412791252136\n"
ROWS_PER_EPOCH = 40
MODEL = ("model_name=bench.tasks.wide_mlp", "model_params={'width': 1024, 'depth': 4}")


def _metrics_figures(fs, bucket: str, reps: int) -> list:
    """``(epochs, size, whole upload s, one epoch's part s)`` medians."""
    rows = []
    part = ROW * ROWS_PER_EPOCH
    for epochs in (10, 100, 1000, 10000):
        data = part * epochs
        whole, parts = [], []
        for rep in range(reps):
            start = time.perf_counter()
            fs.pipe_file(f"{bucket}/metrics.csv", data)
            whole.append(time.perf_counter() - start)
            start = time.perf_counter()
            fs.pipe_file(f"{bucket}/metrics/part_{epochs:05d}_{rep}.csv", part)
            parts.append(time.perf_counter() - start)
        rows.append((epochs, len(data), common.median(whole), common.median(parts)))
    return rows


def _stall(save_dir: str, env: dict, epochs: int, *extra) -> float:
    """The median per-epoch checkpoint stall (s) of one run, epochs after the first."""
    overrides = [
        f"save_dir={save_dir!r}",
        f"max_epochs={epochs}",
        "train_length=8",
        "every_val=0",
        "score_name=None",
        "logger_name=['csv']",
        *MODEL,
        *extra,
    ]
    command = [sys.executable, "-m", "gatle_ignite", "train", f"--config={common.CONFIG}"]
    command += [f"--override={item}" for item in overrides]
    done = subprocess.run(command, cwd=common.ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    from gatle_ignite.run.storage import local_dir

    with open(local_dir(save_dir) / "metrics.csv", newline="") as handle:
        stalls = [
            float(row["value"])
            for row in csv.DictReader(handle)
            if row["name"] == "perf/checkpoint_stall_s"
        ]
    return common.median(stalls[1:] or stalls)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(common.ROOT))
    from tests.s3_server import S3Server

    server = S3Server().start()
    work = Path(tempfile.mkdtemp(prefix="gatle-bench-s3-"))
    env = {**os.environ, **server.env(), "GATLE_IGNITE_CACHE": str(work / "cache")}
    os.environ.update(env)
    try:
        import fsspec

        fs = fsspec.filesystem("s3")
        fs.mkdir("bench")
        print("metrics.csv on S3 (moto, loopback): one upload, median of", args.reps)
        print(f"{'epochs':>8} {'size':>10} {'whole file':>12} {'one part':>10}")
        for epochs, size, whole, part in _metrics_figures(fs, "bench", args.reps):
            print(f"{epochs:>8} {size / 1024:>8.0f}KB {whole * 1e3:>10.1f}ms {part * 1e3:>8.1f}ms")
        print()
        print(f"checkpoint stall per epoch (perf/checkpoint_stall_s), median of {args.reps} runs")
        variants = (
            ("local save_dir", lambda rep: str(work / f"local_{rep}"), ()),
            ("s3://, in the loop", lambda rep: f"s3://bench/sync_{rep}", ()),
            ("s3://, async_save", lambda rep: f"s3://bench/async_{rep}", ("async_save=True",)),
        )
        for label, where, extra in variants:
            stalls = [_stall(where(rep), env, args.epochs, *extra) for rep in range(args.reps)]
            print(f"  {label:<20} {common.median(stalls) * 1e3:8.1f} ms")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
