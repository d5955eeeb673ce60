"""Checkpoint save time of a ~100 M parameter model, against a bare ``torch.save``; and what an
epoch's boundary and a run's end cost on the bench task, against a bare loop's.

    python -m bench.checkpoint [--reps 12] [--dir DIR]
    python -m bench.checkpoint --boundary [--reps 5]

Epoch boundaries (``--boundary``, also run by ``bench.run_all``): the bench config with the usual
extras (progress lines, metrics.csv, the latest checkpoint at every epoch's end, no evaluation)
against a bare loop that saves the same model and optimizer with ``torch.save`` and prints a
line at every epoch's end. Each process measures its own CPU time (``time.process_time``) from
an epoch's last step to the next epoch's first (the median over 12 epochs), and from the last
step to the end of the run (gatle-ignite's to the return of its command, summary included; the
bench's own final-loss pass and temporary directory are left out). Processes alternate, and
each ratio is paired by repetition.

One process trains the bench config with ``bench.tasks.wide_mlp`` (101 M parameters, AdamW,
so the file holds weights and both moments) for one iteration, then alternates the "latest"
handler gatle-ignite calls at every epoch end with ``torch.save`` of the same objects' state
dicts to a new file, removing the one it replaces, as the handler does (n_saved=1). Dirty
pages are flushed before every timing. Serialisation is user CPU time; the kernel's page and
file work is system time, which on a virtual machine swings by several times from one write
to the next. ``--dir`` picks the file system (``/dev/shm`` takes the disk out).
"""

import csv
import math
import os
import resource
import tempfile
import time
from pathlib import Path

from bench import common

SAVE_LIMIT = 1.2
BOUNDARY_LIMIT, END_LIMIT = 1.3, 1.2
BOUNDARY_EPOCHS = 12
# The usual extras, without an evaluation: the boundary is then the checkpoint and the records.
USUAL = ("logger_name=['csv']", "every_val=0", "score_name=None")
OVERRIDES = (
    "max_epochs=1",
    "train_length=1",
    "every_val=0",
    "score_name=None",
    "logger_name=[]",
    "model_name=bench.tasks.wide_mlp",
)


def _timed(func):
    """``(wall, user CPU, system CPU)`` seconds of one call."""
    os.sync()
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    func()
    end, after = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    return end - start, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def _crossover(gatle, bare, index):
    """The ratio, free of the order effect: the median over pairs of consecutive repetitions
    (which run in opposite orders) of the geometric mean of their two ratios.

    On this VM a write right after another one's file removal is much cheaper, whichever of
    the two it is; within a pair each side runs once first and once second.
    """
    ratios = [g[index] / b[index] for g, b in zip(gatle, bare)]
    pairs = [math.sqrt(a * b) for a, b in zip(ratios[0::2], ratios[1::2])]
    return common.median(pairs or ratios)


def child(name, args):
    if name == "bare":
        return boundary_bare()
    if name == "gatle":
        return boundary_gatle()
    return save_child(args)


def save_child(args):
    import torch

    from bench.tasks.trainer import Trainer
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file

    torch.set_num_threads(1)
    times = {"gatle": [], "bare": []}
    with tempfile.TemporaryDirectory(prefix="gatle-bench-ckpt-", dir=args.directory) as tmp:
        cfg = load_config_from_file(common.ROOT / common.CONFIG)
        apply_overrides(cfg, [f"save_dir={tmp}/gatle", *OVERRIDES])
        cfg.model_params = {"in_dim": 64, "n_classes": 10}
        trainer = Trainer(0, cfg).fit()
        engine, latest = trainer.engines["trainer"], trainer._latest
        weight = next(trainer.model.parameters())
        files = []

        def save_bare():
            state = {key: obj.state_dict() for key, obj in latest.to_save.items()}
            torch.save(state, files[-1])
            # The handler's file lifecycle: the old file goes once the new one is written. On a
            # VM, memory just freed is cheap to reuse, so either side doing it alone skews both.
            if len(files) > 1:
                files.pop(0).unlink()

        saves = {"gatle": lambda: latest(engine), "bare": save_bare}
        for rep in range(args.reps or 12):
            # A new epoch, so the handler writes a new file (and drops the old one); and an
            # in-place change, or it would link the unchanged state instead of writing it.
            engine.state.epoch += 1
            with torch.no_grad():
                weight.add_(0.0)
            files.append(Path(tmp) / f"bare_{rep + 1}.pt")
            for name in ("gatle", "bare") if rep % 2 == 0 else ("bare", "gatle"):
                times[name].append(_timed(saves[name]))
        sizes = {"gatle": Path(latest.last_checkpoint).stat().st_size}
        sizes["bare"] = files[-1].stat().st_size
    parameters = sum(p.numel() for p in trainer.model.parameters())
    return {"times": times, "sizes": sizes, "parameters": parameters}


def boundary_bare():
    """The bare loop: ``torch.save`` of the model and optimizer and a line per epoch."""
    import torch

    tensors, train, model, optimizer = common.seeded_task()
    boundaries, last_end = [], None
    with tempfile.TemporaryDirectory(prefix="gatle-bench-bare-") as tmp:
        for epoch in range(1, BOUNDARY_EPOCHS + 1):
            for index, (x, y) in enumerate(train):
                if index == 0 and last_end is not None:
                    boundaries.append(time.process_time() - last_end)
                loss = common.bare_step(model, optimizer, x, y)
                last_end = time.process_time()
            print(f"epoch {epoch}: train/loss {float(loss):.4f}")
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, Path(tmp) / "latest.pt")
        end = time.process_time() - last_end
    return {"boundary": common.median(boundaries), "end": end}


def boundary_gatle():
    """``gatle-ignite train`` with the usual extras, the bench trainer timing its boundaries."""
    os.environ[common.BOUNDARY_ENV] = "1"
    record = common.run_gatle((*USUAL, f"max_epochs={BOUNDARY_EPOCHS}"))
    # When main() returned: the run's end, the summary included, less the bench's own pass.
    end = record["returned_cpu"] - record["last_step_end"] - record["record_cpu"]
    return {"boundary": common.median(record["boundaries"]), "end": end}


def run_boundary(reps=None):
    """Epoch boundaries and the run's end against the bare loop's; returns the checks."""
    print("== epoch boundary and end of run ==")
    variants = {"bare": "bare loop + torch.save, print", "gatle": "gatle-ignite, usual extras"}
    results = common.interleaved("bench.checkpoint", list(variants), reps or 5, ["--boundary"])
    rows, checks = [], []
    for what, limit in (("boundary", BOUNDARY_LIMIT), ("end", END_LIMIT)):
        values = {name: [r[what] for r in results[name]] for name in variants}
        ratio = common.paired_ratio(values["gatle"], values["bare"])
        cells = [f"{common.median(values[n]) * 1e3:.2f}" for n in variants]
        rows.append([what, *cells, f"{ratio:.2f}x", f"{common.spread(values['gatle']):.0f}%"])
        label = "epoch boundary" if what == "boundary" else "end of run"
        checks.append(common.Check(f"checkpoint: {label} vs a bare loop's, CPU", ratio, limit))
    headers = ["CPU", *(f"{label} ms" for label in variants.values()), "ratio", "±"]
    text = common.table(headers, rows)
    text += f"\n\n{_summary_read()}"
    print(text)
    return text, checks


def _summary_read(iterations=100_000):
    """What the end-of-run summary's read of metrics.csv costs after a long run: a point (two
    rows) every iteration and a perf/ record every 1000."""
    from gatle_ignite.cli.time_breakdown import time_breakdown_rows
    from gatle_ignite.config.base import base_config

    with tempfile.TemporaryDirectory(prefix="gatle-bench-history-") as tmp:
        rows = [("wall_time", "epoch", "step", "name", "value")]
        for step in range(1, iterations + 1):
            rows += [(1e9, step // 1000 + 1, step, "train/lr_0", 1e-3)]
            rows += [(1e9, step // 1000 + 1, step, "train/loss", 0.123456)]
            if step % 1000 == 0:
                rows += [(1e9, step // 1000, step, f"perf/{n}", 1.5) for n in ("train_time_s",)]
        with open(Path(tmp) / "metrics.csv", "w", newline="") as handle:
            csv.writer(handle).writerows(rows)
        start = time.process_time()
        time_breakdown_rows(base_config(), Path(tmp), 0, 1.0)
        spent = time.process_time() - start
    return (
        f"The summary's read of a {iterations:,}-iteration metrics.csv ({len(rows) - 1:,} rows): "
        f"{spent * 1e3:.0f} ms of CPU."
    )


def run(reps=None, directory=None, boundary=False):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    if boundary:
        return run_boundary(reps)
    text, checks = run_save(reps, directory)
    more, found = run_boundary(None)
    return f"{text}\n\n{more}", checks + found


def run_save(reps=None, directory=None):
    print("== checkpoint ==")
    args = (["--reps", str(reps)] if reps else []) + (["--dir", directory] if directory else [])
    result = common.run_child("bench.checkpoint", "all", args)
    gatle, bare = result["times"]["gatle"], result["times"]["bare"]
    wall, user = (_crossover(gatle, bare, i) for i in (0, 1))
    rows = []
    for name, values, ratios in (("bare", bare, (1, 1)), ("gatle", gatle, (wall, user))):
        cells = [f"{common.median([v[i] for v in values]):.3f}" for i in (0, 1, 2)]
        cells += [f"{r:.3f}x" for r in ratios] + [f"{common.spread([v[0] for v in values]):.0f}%"]
        size = result["sizes"][name] / 2**20
        rows.append(["torch.save" if name == "bare" else "gatle-ignite", *cells, f"{size:.1f}"])
    headers = ["save", "wall s", "user s", "sys s", "wall ratio", "user ratio", "±", "MiB"]
    text = common.table(headers, rows)
    text += f"\n\n{result['parameters'] / 1e6:.1f} M parameters, AdamW state included."
    print(text)
    note = f"user CPU {user:.3f}x"
    return text, [common.Check("checkpoint: save vs torch.save", wall, SAVE_LIMIT, note=note)]


if __name__ == "__main__":
    options = [
        ("--dir", {"dest": "directory", "help": "where the files go (default: /tmp)"}),
        ("--boundary", {"action": "store_true", "help": "only the epoch boundary and run's end"}),
    ]
    common.main(__doc__, run, child, options)
