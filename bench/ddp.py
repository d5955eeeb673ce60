"""2-process DDP on CPU (gloo): gatle-ignite against a bare DDP loop, and what one check costs.

    python -m bench.ddp [--reps 7]

Both train the bench config's task on 2 ranks at the same global batch, 64 (32 per rank, so
32 iterations per epoch), for 10 epochs; rank 0 reads the clocks at epoch ends, and the
fastest epoch after the first counts. gatle-ignite (every extra off) spawns its ranks itself
(``nproc_per_node=2``) and runs with ``check_every`` unset (32 under DDP) and 1; the bare loop
is ``torch.multiprocessing`` with ``DistributedDataParallel``. "bare DDP loop + a check per
iteration" adds the all-reduce that each of gatle-ignite's checks makes, so the difference to
the bare loop is the in-loop cost of one check.
"""

import json
import os
import random
import tempfile
from pathlib import Path

from bench import common

EPOCHS = 10
RANKS = 2
VARIANTS = {
    "bare": "bare DDP loop",
    "bare_check": "bare DDP loop + a check per iteration",
    "gatle": "gatle-ignite, check_every unset (32 under DDP)",
    "gatle_k1": "gatle-ignite, check_every=1",
}
TARGET = 1.10
# What the checks may cost at the default cadence, as a share of a bare DDP iteration.
CHECK_SHARE_LIMIT = 0.01


def _bare_rank(rank, port, check):
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    torch.manual_seed(common.SEED)
    dataset = TensorDataset(*common.synthetic_tensors())
    sampler = DistributedSampler(dataset, RANKS, rank, shuffle=True, drop_last=True)
    loader = DataLoader(dataset, batch_size=common.BATCH // RANKS, sampler=sampler, drop_last=True)
    model = torch.nn.parallel.DistributedDataParallel(common.mlp())
    optimizer = common.adamw(model)
    never = torch.iinfo(torch.int64).max
    stamps = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            common.bare_step(model, optimizer, x, y)
            if check:
                # What a check agrees on: the first non-finite iteration and a preemption request.
                flags = torch.tensor([never, 0], dtype=torch.int64)
                dist.all_reduce(flags, op=dist.ReduceOp.MIN)
                flags.tolist()
        stamps.append(common.clock())
    if rank == 0:
        common.write_record({"train": stamps})
    dist.barrier()
    dist.destroy_process_group()


def child(variant, _args):
    import torch.multiprocessing as mp

    name = variant.partition("@")[0]
    if name.startswith("bare"):
        port = random.randint(20000, 40000)
        with tempfile.TemporaryDirectory(prefix="gatle-bench-ddp-") as tmp:
            os.environ[common.RECORD_ENV] = record = str(Path(tmp) / "record.json")
            mp.spawn(_bare_rank, args=(port, name == "bare_check"), nprocs=RANKS, join=True)
            stamps = json.loads(Path(record).read_text())["train"]
    else:
        every = ["check_every=1"] if name == "gatle_k1" else []
        overrides = [*common.EXTRAS_OFF, f"max_epochs={EPOCHS}", f"nproc_per_node={RANKS}"]
        stamps = common.run_gatle([*overrides, *every])["train"]
    return {"per_iteration": common.per_iteration(stamps, common.ITERS_PER_EPOCH)}


def _run_child(name):
    """One variant; retried once, since gloo's teardown here sometimes aborts a finished rank
    ("terminate called without an active exception"), with or without gatle-ignite."""
    try:
        return common.run_child("bench.ddp", name)
    except RuntimeError as error:
        print(f"  {name} failed, retrying once: {str(error).splitlines()[-1]}")
        return common.run_child("bench.ddp", name)


def check_cost(times):
    """Wall seconds of one check: in the bare loop with a check per iteration, and in
    gatle-ignite at check_every=1 against 32 (31 more checks per 32 iterations)."""
    wall = {name: [t[0] for t in values] for name, values in times.items()}
    bare = common.median([c - b for c, b in zip(wall["bare_check"], wall["bare"])])
    gatle = common.median([(k1 - k) * 32 / 31 for k1, k in zip(wall["gatle_k1"], wall["gatle"])])
    return bare, gatle, common.median(wall["bare"])


def run(reps=None):
    """Measure, print the tables, return the checks (bench.run_all calls this)."""
    from gatle_ignite.trainer.handlers import DEFAULT_CHECK_EVERY as EVERY

    print("== DDP on CPU, 2 ranks ==")
    names = common.with_baseline(VARIANTS, ("gatle",))
    results = common.interleaved("bench.ddp", names, reps or 7, run=_run_child)
    times = {name: [r["per_iteration"] for r in values] for name, values in results.items()}
    text, ratios = common.ratio_table(times, "bare", VARIANTS, "iter")
    bare_cost, gatle_cost, step = check_cost(times)
    share = bare_cost / EVERY / step
    # The least cadence that keeps the checks under CHECK_SHARE_LIMIT of an iteration.
    least = bare_cost / (CHECK_SHARE_LIMIT * step)
    text += (
        f"\n\nOne check costs {bare_cost * 1e6:.0f} us in the bare DDP loop and "
        f"{gatle_cost * 1e6:.0f} us in gatle-ignite; a bare DDP iteration takes "
        f"{step * 1e6:.0f} us. At check_every={EVERY} the checks take {share:.2%} of an "
        f"iteration; under {CHECK_SHARE_LIMIT:.0%} from check_every={least:.1f}."
    )
    print(text)
    checks = [
        common.Check(
            f"ddp: {common.label(VARIANTS, name)} vs bare DDP, wall",
            ratios[name][0],
            TARGET if name == "gatle" else None,
            note=f"cpu {ratios[name][1]:.3f}x",
        )
        for name in names
        if name.startswith("gatle")
    ]
    note = f"one check {bare_cost * 1e6:.0f} us; under 1% from check_every={least:.1f}"
    name = f"ddp: the checks' share of an iteration at check_every={EVERY}"
    checks.append(common.Check(name, share, CHECK_SHARE_LIMIT, unit="", note=note))
    return text, checks


if __name__ == "__main__":
    common.main(__doc__, run, child)
