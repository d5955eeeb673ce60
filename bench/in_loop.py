"""What one small call costs inside a bare training loop, against what ``timeit`` says.

    python -m bench.in_loop [--epochs 120] [CALL ...]

The bare loop of ``bench.train_step`` (the synthetic task, one torch thread) makes one extra
call every third iteration, on odd epochs only; the cost is the difference of the median CPU
time per iteration of odd and even epochs, times three (so run-to-run noise of 1-2 us per
iteration reads as 3-6 us per call; ``nothing``, an empty lambda, shows that floor). Each call
runs in its own process, its stdout a file. A diagnostic: it shows why a framework's
per-iteration Python is priced in microseconds here.
"""

import argparse
import json
import os
import statistics
import sys
import time
import timeit
from pathlib import Path

from bench import common

LINE = "[2026-12-02 16:00:00] TRAIN epoch 3: (0.28) - 9/32\n"


def _calls():
    """name -> the call, each made with what it needs already bound."""
    fd = sys.stdout.fileno()
    data = LINE.encode()
    return {
        "nothing": lambda: None,
        "strftime": lambda: time.strftime("%Y-%m-%d %H:%M:%S"),
        "f-string with a float": lambda: f"TRAIN epoch 3: ({9 / 32:.2f}) - 9/32",
        "os.getpid()": os.getpid,
        "os.write of one line": lambda: os.write(fd, data),
    }


def measure(name, epochs):
    """``(in-loop us, timeit us)`` for one call."""
    import torch.nn.functional as F

    from bench.train_step import _setup

    call = _calls()[name]
    _, loader, model, optimizer = _setup()
    per_iteration = {True: [], False: []}
    for epoch in range(epochs):
        calling = epoch % 2 == 1
        start = time.process_time()
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            if calling and i % 3 == 0:
                call()
        per_iteration[calling].append((time.process_time() - start) / common.ITERS_PER_EPOCH)
    with_call = statistics.median(per_iteration[True][1:])
    without = statistics.median(per_iteration[False][1:])
    alone = min(timeit.repeat(call, number=2000, repeat=5)) / 2000
    return (with_call - without) * 3 * 1e6, alone * 1e6


def main():
    parser = common.out_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--epochs", type=int, default=120)
    parser.add_argument("calls", nargs="*", default=list(_calls()), help=", ".join(_calls()))
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(measure(args.child, args.epochs)))
        return
    unknown = sorted(set(args.calls) - set(_calls()))
    if unknown:
        parser.error(f"unknown call(s) {unknown}; choose from {', '.join(_calls())}")
    results = common.run_each("bench.in_loop", args.calls, ["--epochs", str(args.epochs)])
    rows = [[name, f"{in_loop:.1f}", f"{alone:.2f}"] for name, (in_loop, alone) in results]
    print(common.table(["call", "us per call, in the loop", "us per call, timeit"], rows))


if __name__ == "__main__":
    main()
