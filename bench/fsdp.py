"""FSDP against DDP on 2 CPU processes, and how long a checkpoint stalls the loop.

    python -m bench.fsdp [--reps 5] [--steps 48] [--only memory,stall]

Run from the repository root. Every variant runs in a fresh process with one torch thread;
gatle-ignite spawns the ranks of a 2-process variant itself (gloo on a CPU).

* Memory: ``gatle-ignite train`` of the sharded_lm example (its config as shipped: 108 k
  parameters, AdamW) for ``--steps`` iterations, under ``strategy`` fsdp and ddp, in 1 and 2
  processes. After training every rank sums the bytes of its parameters, gradients and
  optimizer state, a DTensor counting its local shard only (``to_local()``). The figure is the
  largest rank's, against the 1-process run's. DDP's gradient buckets, a further copy, are not
  counted.
* Loss curve: the same 2-process runs, from the same seed with the same global batch (32, so
  16 per rank) and the same samples on each rank. Every rank records its loss at every step;
  the curves compared are the mean over the ranks, step by step.
* Stall: one process trains the sharded_lm model at ~100 M parameters (dim 1024, 8 blocks)
  for one iteration, then calls the "latest" checkpoint handler ``--reps`` times, each for a
  new epoch, timing the call: that is how long the loop stops for a checkpoint. ``.pt`` comes
  from strategy ddp, ``.dcp`` from strategy fsdp (in one process: DCP's writer, no peers).
  With ``async_save`` the background write is waited for after the timed call, as the
  training between two checkpoints would; its end is the "on disk" column.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ignite.distributed as idist
from ignite.engine import Events

from bench import common
from examples.sharded_lm.trainer.lm_trainer import Trainer as LMTrainer

CONFIG = "examples/sharded_lm/configs/sharded_lm_v0.py"
# Set by the process that starts a training variant: the directory each rank writes into.
RECORD_DIR_ENV = "GATLE_BENCH_FSDP_RECORD"
NO_EXTRAS = ("logger_name=[]", "every_val=0", "score_name=None", "verbosity=0")
TRAINING = ("ddp_1", "fsdp_1", "ddp_2", "fsdp_2")
STALLS = {
    "pt_block": ("ddp", False),
    "pt_async": ("ddp", True),
    "dcp_block": ("fsdp", False),
    "dcp_async": ("fsdp", True),
}
# About 100 M parameters: 8 blocks of 12 x 1024^2.
LARGE_MODEL = {"dim": 1024, "heads": 16, "layers": 8}
MEMORY_LIMIT = 0.55
STALL_LIMIT = 0.25
COPIES = ("copy_fresh", "copy_kept")
# DDP all-reduces gradients, FSDP reduce-scatters them; over 2 ranks both halve a sum of two,
# which is exact, so the curves agree to the bit. Other world sizes round differently.
LOSS_TOLERANCE = 1e-4


class Trainer(LMTrainer):
    """The example's trainer; each rank also records its loss at every step and, after
    training, the bytes it holds. ``main_runner='bench.fsdp'`` selects it."""

    def attach_progress(self):
        super().attach_progress()
        self.step_losses = []
        self.engines["trainer"].add_event_handler(Events.ITERATION_COMPLETED, self._record_loss)

    def _record_loss(self, engine):
        self.step_losses.append(float(engine.state.output["losses"]["loss"]))

    def fit(self):
        super().fit()
        record = {"losses": self.step_losses, "bytes": held_bytes(self.model, self.optimizer)}
        path = Path(os.environ[RECORD_DIR_ENV]) / f"rank{idist.get_rank()}.json"
        path.write_text(json.dumps(record))
        return self


def local_bytes(tensor) -> int:
    """The bytes this process stores for ``tensor``: its own shard of a DTensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def held_bytes(model, optimizer) -> dict:
    """Parameters, gradients and optimizer state, in bytes, as this rank holds them."""
    parameters = list(model.parameters())
    return {
        "parameters": sum(local_bytes(p) for p in parameters),
        "gradients": sum(local_bytes(p.grad) for p in parameters if p.grad is not None),
        "optimizer": sum(local_bytes(v) for v in optimizer_tensors(optimizer)),
    }


def optimizer_tensors(optimizer) -> list:
    """Every tensor of the optimizer's state (AdamW: both moments and the step counter)."""
    import torch

    return [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]


def train_variant(variant: str, steps: int) -> list:
    """``gatle-ignite train`` of the example in this process; every rank's record."""
    from gatle_ignite.cli.main import main as gatle_ignite

    strategy, world = variant.split("_")
    with tempfile.TemporaryDirectory(prefix="gatle-bench-fsdp-") as tmp:
        os.environ[RECORD_DIR_ENV] = tmp
        overrides = [
            f"save_dir='{tmp}/run'",
            "main_runner='bench.fsdp'",
            f"strategy='{strategy}'",
            f"nproc_per_node={world}",
            "auto_model_params.sync_bn=False",
            "max_epochs=1",
            f"train_length={steps}",
            "save_ckpt=False",
            *NO_EXTRAS,
        ]
        code = gatle_ignite(
            ["train", f"--config={CONFIG}", *(f"--override={o}" for o in overrides)]
        )
        if code != 0:
            raise SystemExit(code)
        return [json.loads(path.read_text()) for path in sorted(Path(tmp).glob("rank*.json"))]


def stall_variant(variant: str, reps: int) -> dict:
    """Seconds the loop stops for each of ``reps`` checkpoints, and until each is on disk."""
    import torch

    from gatle_ignite.config.loader import apply_overrides, load_config_from_file
    from gatle_ignite.trainer.lifecycle import settle_writes

    strategy, asynchronous = STALLS[variant]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="gatle-bench-fsdp-") as tmp:
        cfg = load_config_from_file(common.ROOT / CONFIG)
        overrides = [
            f"save_dir='{tmp}/run'",
            f"strategy='{strategy}'",
            "nproc_per_node=1",
            f"async_save={asynchronous}",
            "max_epochs=1",
            "train_length=1",
            *NO_EXTRAS,
        ]
        apply_overrides(cfg, overrides)
        cfg.model_params = {**cfg.model_params, **LARGE_MODEL}
        cfg.train_ds_params = {**cfg.train_ds_params, "bs": 2}
        trainer = LMTrainer(0, cfg).fit()
        engine, latest = trainer.engines["trainer"], trainer._latest
        stalls, on_disk = [], []
        for _ in range(reps):
            # An epoch later: a new name, and a trainer state no earlier file holds (an unchanged
            # checkpoint would be a hard link to the last one, not a write).
            engine.state.epoch += 1
            engine.state.iteration += engine.state.epoch_length
            os.sync()
            start = time.perf_counter()
            latest(engine)
            stalls.append(time.perf_counter() - start)
            settle_writes(trainer)
            on_disk.append(time.perf_counter() - start)
        parameters = sum(p.numel() for p in trainer.model.parameters())
        copies = host_copy_seconds(trainer.model, trainer.optimizer)
        return {"stall": stalls, "on_disk": on_disk, "parameters": parameters, **copies}


def host_copy_seconds(model, optimizer) -> dict:
    """Seconds to copy the weights and optimizer state to host memory: into new memory, as
    ``async_save`` does at every checkpoint, then into the buffers that first copy made."""
    state = [*model.state_dict().values(), *optimizer_tensors(optimizer)]
    start = time.perf_counter()
    buffers = [tensor.to("cpu", copy=True) for tensor in state]
    fresh = time.perf_counter() - start
    start = time.perf_counter()
    for buffer, tensor in zip(buffers, state):
        buffer.copy_(tensor)
    kept = time.perf_counter() - start
    copied = sum(local_bytes(tensor) for tensor in state)
    return {"copy_fresh": fresh, "copy_kept": kept, "copied_bytes": copied}


def run_variant(variant: str, args) -> object:
    """One variant in a fresh process with one torch thread; what it measured."""
    with tempfile.TemporaryDirectory(prefix="gatle-bench-fsdp-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "bench.fsdp", "--child", variant, "--out", str(out)]
        command += [str(a) for a in args]
        done = subprocess.run(
            command, cwd=common.ROOT, env=common.child_env(), capture_output=True, text=True
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"{variant} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(out.read_text())


def run_training_variant(variant: str, steps: int) -> list:
    """One training variant; retried once, since gloo's teardown here sometimes aborts a rank
    that has finished (see bench/README.md, DDP)."""
    try:
        return run_variant(variant, ["--steps", steps])
    except RuntimeError as error:
        print(f"  {variant} failed, retrying once: {str(error).splitlines()[0]}")
        return run_variant(variant, ["--steps", steps])


def kib(count: int) -> str:
    return f"{count / 1024:,.1f}"


def memory_section(records: dict) -> tuple:
    """The bytes table, and ``{strategy: 2-process per-rank total / 1-process total}``."""
    rows, ratios = [], {}
    for strategy in ("fsdp", "ddp"):
        alone = _total(_largest(records[f"{strategy}_1"]))
        for world in ("1", "2"):
            held = _largest(records[f"{strategy}_{world}"])
            rows.append([strategy, world, *map(kib, held.values()), kib(_total(held))])
            rows[-1].append(f"{_total(held) / alone:.3f}x")
        ratios[strategy] = _total(_largest(records[f"{strategy}_2"])) / alone
    headers = ["strategy", "processes", "parameters KiB", "gradients KiB", "optimizer KiB"]
    headers += ["per rank KiB", "vs 1 process"]
    return common.table(headers, rows), ratios


def _largest(records: list) -> dict:
    """The bytes of the rank that holds the most."""
    return max((record["bytes"] for record in records), key=_total)


def _total(held: dict) -> int:
    return sum(held.values())


def mean_curve(records: list) -> list:
    """The loss at each step, averaged over the ranks: the loss of the global batch."""
    return [sum(step) / len(step) for step in zip(*(record["losses"] for record in records))]


def loss_section(records: dict) -> tuple:
    """The per-step table of both curves, and their largest difference."""
    ddp, fsdp = mean_curve(records["ddp_2"]), mean_curve(records["fsdp_2"])
    gaps = [abs(a - b) for a, b in zip(ddp, fsdp)]
    rows = [
        [i + 1, f"{a:.6f}", f"{b:.6f}", f"{g:.2e}"]
        for i, (a, b, g) in enumerate(zip(ddp, fsdp, gaps))
    ]
    text = common.table(["step", "DDP loss", "FSDP loss", "abs difference"], rows)
    if len(ddp) != len(fsdp) or not gaps:
        return text, float("inf")
    return text, max(gaps)


def stall_section(results: dict) -> tuple:
    """The stall table, ``{format: async stall / blocking stall}`` (medians), and a copy into
    kept buffers against the blocking ``.pt`` save."""
    blocking = {fmt: common.median(results[f"{fmt}_block"]["stall"]) for fmt in ("pt", "dcp")}
    rows = []
    for variant, (_strategy, asynchronous) in STALLS.items():
        fmt = variant.split("_")[0]
        stalls, on_disk = results[variant]["stall"], results[variant]["on_disk"]
        rows.append(
            [
                f".{fmt}",
                "on" if asynchronous else "off",
                f"{common.median(stalls):.3f}",
                f"{common.spread(stalls):.0f}%",
                f"{common.median(on_disk):.3f}",
                f"{common.median(stalls) / blocking[fmt]:.3f}x",
            ]
        )
    headers = ["format", "async_save", "stall s", "±", "on disk s", "stall vs blocking"]
    millions = results["pt_block"]["parameters"] / 1e6
    fresh, kept = (common.median([r[key] for r in results.values()]) for key in COPIES)
    gib = results["pt_block"]["copied_bytes"] / 2**30
    text = common.table(headers, rows) + (
        f"\n\n{millions:.1f} M parameters, AdamW state included. Copying the weights and "
        f"optimizer state ({gib:.2f} GiB) to host memory took {fresh:.3f} s into new memory "
        f"and {kept:.3f} s into the buffers of that copy (medians over the variants)."
    )
    ratios = {
        fmt: common.median(results[f"{fmt}_async"]["stall"]) / b for fmt, b in blocking.items()
    }
    return text, ratios, kept / blocking["pt"]


def measure_training(steps: int) -> tuple:
    print(f"== FSDP and DDP: memory per rank and the loss curve ({steps} steps) ==")
    records = {variant: run_training_variant(variant, steps) for variant in TRAINING}
    memory, ratios = memory_section(records)
    curves, largest_gap = loss_section(records)
    text = f"{memory}\n\n{curves}"
    checks = [
        common.Check(
            "fsdp: per-rank parameter+gradient+optimizer bytes, 2 processes vs 1",
            ratios["fsdp"],
            MEMORY_LIMIT,
        ),
        common.Check(
            "fsdp: the same per-rank bytes under ddp, 2 processes vs 1",
            ratios["ddp"],
            None,
            note="each DDP rank holds a whole copy",
        ),
        common.Check(
            f"fsdp: FSDP vs DDP loss curve, largest difference over {steps} steps",
            largest_gap,
            LOSS_TOLERANCE,
            unit="",
        ),
    ]
    return text, checks


def measure_stall(reps: int) -> tuple:
    print(f"== checkpoint stall, async_save against blocking ({reps} checkpoints each) ==")
    results = {variant: run_variant(variant, ["--reps", reps]) for variant in STALLS}
    text, ratios, kept = stall_section(results)
    checks = [
        common.Check(
            f"fsdp: checkpoint stall with async_save vs blocking, .{fmt}", ratio, STALL_LIMIT
        )
        for fmt, ratio in ratios.items()
    ]
    checks.append(
        common.Check(
            "fsdp: host copy into kept buffers vs blocking .pt save",
            kept,
            None,
            note="one copy into the kept host buffers: the floor of async_save's stall",
        )
    )
    return text, checks


def run(reps=None, steps=48, only=("memory", "stall")):
    """Measure, print the tables, return the checks (bench.run_all calls this)."""
    reps = reps or 5
    sections, checks = [], []
    for part, measure, count in (
        ("memory", measure_training, steps),
        ("stall", measure_stall, reps),
    ):
        if part in only:
            text, found = measure(count)
            print(text, end="\n\n")
            sections.append(text)
            checks += found
    return "\n\n".join(sections), checks


def child(variant: str, args) -> object:
    if variant in STALLS:
        return stall_variant(variant, args.reps)
    return train_variant(variant, args.steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="checkpoints timed per variant")
    parser.add_argument("--steps", type=int, default=48, help="training steps compared")
    parser.add_argument(
        "--only", default="memory,stall", help="memory (with the loss curve), stall"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(child(args.child, args)))
        return
    _, checks = run(args.reps, args.steps, args.only.split(","))
    print(common.checks_table(checks))


if __name__ == "__main__":
    main()
