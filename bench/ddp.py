"""2-process DDP throughput on CPU (gloo) against 1 process, at the same global batch.

    python -m bench.ddp [--reps 3]

gatle-ignite trains the bench config with every extra off, spawning its ranks itself
(``nproc_per_node=2``); a bare loop with ``torch.multiprocessing`` and ``DistributedDataParallel``
is the reference. The global batch stays 64 (32 per rank), so each epoch is 32 iterations in
both topologies. Samples per second are read by rank 0 at epoch ends, after a warm-up epoch.
"""

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

from bench import common

EPOCHS = 10
VARIANTS = {
    "bare_1": "bare loop, 1 process",
    "bare_2": "bare DDP loop, 2 processes",
    "gatle_1": "gatle-ignite, 1 process",
    "gatle_2": "gatle-ignite, 2 processes",
}
EXTRAS_OFF = ("logger_name=[]", "every_val=0", "save_ckpt=False", "score_name=None")


def _bare_worker(rank, world, port, record):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    if world > 1:
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(common.SEED)
    dataset = TensorDataset(*common.synthetic_tensors())
    sampler = DistributedSampler(dataset, world, rank, shuffle=True, drop_last=True)
    loader = DataLoader(dataset, batch_size=common.BATCH // world, sampler=sampler, drop_last=True)
    model = common.mlp()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = common.adamw(model)
    stamps = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        stamps.append(common.clock())
    if rank == 0:
        Path(record).write_text(json.dumps({"train": stamps}))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def run_bare(world, record):
    import torch.multiprocessing as mp

    port = random.randint(20000, 40000)
    if world == 1:
        _bare_worker(0, 1, port, record)
    else:
        mp.spawn(_bare_worker, args=(world, port, record), nprocs=world, join=True)


def run_gatle(world, record):
    from gatle_ignite.cli.main import main

    os.environ[common.RECORD_ENV] = record
    with tempfile.TemporaryDirectory(prefix="gatle-bench-ddp-") as tmp:
        overrides = [
            f"save_dir={tmp}",
            f"max_epochs={EPOCHS}",
            f"nproc_per_node={world}",
            *EXTRAS_OFF,
        ]
        code = main(["train", f"--config={common.CONFIG}"] + [f"--override={o}" for o in overrides])
    if code != 0:
        raise SystemExit(code)


def run_child(variant):
    kind, world = variant.split("_")
    with tempfile.TemporaryDirectory(prefix="gatle-bench-ddp-") as tmp:
        record = str(Path(tmp) / "record.json")
        (run_bare if kind == "bare" else run_gatle)(int(world), record)
        stamps = json.loads(Path(record).read_text())["train"]
    wall, cpu = common.per_iteration(stamps, common.ITERS_PER_EPOCH)
    return {"samples_per_s": common.BATCH / wall, "ms_per_iter": wall * 1e3, "cpu": cpu}


def _run_child(name):
    """One variant; retried once, since gloo's teardown here sometimes aborts a finished rank
    ("terminate called without an active exception"), with or without gatle-ignite."""
    try:
        return common.run_child("bench.ddp", ["--child", name])
    except RuntimeError as error:
        print(f"  {name} failed, retrying once: {str(error).splitlines()[-1]}")
        return common.run_child("bench.ddp", ["--child", name])


def run(reps=3):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== DDP on CPU ==")
    names = list(VARIANTS)
    rates = {name: [] for name in names}
    for rep in range(reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            rates[name].append(_run_child(name)["samples_per_s"])
    rows = []
    scaling = {}
    for kind in ("bare", "gatle"):
        one, two = rates[f"{kind}_1"], rates[f"{kind}_2"]
        scaling[kind] = common.median([b / a for a, b in zip(one, two)])
        for name, values in ((f"{kind}_1", one), (f"{kind}_2", two)):
            rows.append(
                [
                    VARIANTS[name],
                    f"{common.median(values):.0f}",
                    f"{common.spread(values):.0f}%",
                    f"{scaling[kind]:.2f}x" if name.endswith("_2") else "1.00x",
                ]
            )
    text = common.table(["variant", "samples/s", "±", "2 vs 1 process"], rows)
    overhead = common.median([b / g for b, g in zip(rates["bare_2"], rates["gatle_2"])])
    text += f"\n\nbare DDP / gatle-ignite DDP throughput: {overhead:.2f}x (per-rep median)."
    print(text)
    checks = [
        common.Check(
            "ddp: gatle-ignite 2 processes vs 1 (throughput)",
            scaling["gatle"],
            None,
            note=f"bare DDP {scaling['bare']:.2f}x; bare/gatle at 2 processes {overhead:.2f}x",
        )
    ]
    return text, checks


def main():
    parser = common.out_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(run_child(args.child)))
        return
    _, checks = run(args.reps)
    print(common.checks_table(checks))


if __name__ == "__main__":
    main()
