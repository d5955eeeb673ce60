"""Checkpoint save and load of a ~100 M parameter model, against a bare ``torch.save``.

    python -m bench.checkpoint [--reps 12] [--dir DIR]

One process trains the bench config with ``bench.tasks.wide_mlp`` (101 M parameters, AdamW,
so the file holds weights and both moments) for one iteration, then alternates: the "latest"
handler gatle-ignite calls at every epoch end, and ``torch.save`` of the same objects' state
dicts to a new file, removing the one it replaces, as the handler does (n_saved=1); then
``load_checkpoints`` (resume) and ``torch.load`` + ``load_state_dict``. Dirty pages are
flushed before every timing so no write pays for the previous one's writeback. Consecutive
repetitions run in opposite orders, and each ratio is taken over such pairs (``_crossover``).

Time is split into user and system CPU: serialisation is user time, the kernel's page and
file work is system time, and on a virtual machine the latter swings by several times from
one write to the next. ``--dir`` picks the file system (``/dev/shm`` takes the disk out).
"""

import argparse
import json
import math
import os
import resource
import tempfile
from pathlib import Path

from bench import common

SAVE_LIMIT = 1.2
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
    start, before = common.clock()[0], resource.getrusage(resource.RUSAGE_SELF)
    func()
    end, after = common.clock()[0], resource.getrusage(resource.RUSAGE_SELF)
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


def run_child(reps, directory=None):
    import torch

    from bench.tasks.trainer import Trainer
    from gatle_ignite.config.loader import apply_overrides, load_config_from_file
    from gatle_ignite.trainer.checkpointing import load_checkpoints

    torch.set_num_threads(1)
    result = {"save": {"gatle": [], "bare": []}, "load": {"gatle": [], "bare": []}}
    with tempfile.TemporaryDirectory(prefix="gatle-bench-ckpt-", dir=directory) as tmp:
        cfg = load_config_from_file(common.ROOT / common.CONFIG)
        apply_overrides(cfg, [f"save_dir={tmp}/gatle", *OVERRIDES])
        cfg.model_params = {"in_dim": 64, "n_classes": 10}
        trainer = Trainer(0, cfg).fit()
        result["parameters"] = sum(p.numel() for p in trainer.model.parameters())
        engine, latest = trainer.engines["trainer"], trainer._latest
        objects = latest.to_save
        step = engine.state.epoch
        bare = {"new": Path(tmp) / f"bare_{step}.pt", "old": None}

        def save_gatle():
            latest(engine)

        def save_bare():
            torch.save({key: obj.state_dict() for key, obj in objects.items()}, bare["new"])
            # The handler's file lifecycle: the old file goes once the new one is written. On a
            # VM, memory just freed is cheap to reuse, so either side doing it alone skews both.
            if bare["old"] is not None:
                bare["old"].unlink()

        def load_gatle():
            load_checkpoints(trainer)

        def load_bare():
            state = torch.load(bare["new"], map_location="cpu", weights_only=True)
            for key, obj in objects.items():
                obj.load_state_dict(state[key])

        cfg.resume = True
        for rep in range(reps):
            # A new step, so the handler writes a new file (and drops the old one, n_saved=1).
            step += 1
            engine.state.epoch = step
            bare["old"], bare["new"] = bare["new"], Path(tmp) / f"bare_{step}.pt"
            if not bare["old"].exists():
                bare["old"] = None
            order = ("gatle", "bare") if rep % 2 == 0 else ("bare", "gatle")
            for name in order:
                save = save_gatle if name == "gatle" else save_bare
                result["save"][name].append(_timed(save))
            for name in order:
                load = load_gatle if name == "gatle" else load_bare
                result["load"][name].append(_timed(load))
        result["size"] = {
            "gatle": Path(latest.last_checkpoint).stat().st_size,
            "bare": bare["new"].stat().st_size,
        }
    return result


def run(reps=12, directory=None):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== checkpoint ==")
    args = ["--child", "all", "--reps", str(reps)] + (["--dir", directory] if directory else [])
    result = common.run_child("bench.checkpoint", args)
    rows, ratios = [], {}
    for op in ("save", "load"):
        gatle, bare = result[op]["gatle"], result[op]["bare"]
        ratios[op] = [_crossover(gatle, bare, i) for i in (0, 1)]
        for name, values in (("torch.save / torch.load", bare), ("gatle-ignite", gatle)):
            size = result["size"]["bare" if values is bare else "gatle"]
            ratio = "1.000x" if values is bare else f"{ratios[op][0]:.3f}x"
            user = "1.000x" if values is bare else f"{ratios[op][1]:.3f}x"
            rows.append(
                [
                    f"{op}: {name}",
                    *(f"{common.median([v[i] for v in values]):.3f}" for i in (0, 1, 2)),
                    ratio,
                    user,
                    f"{common.spread([v[0] for v in values]):.0f}%",
                    f"{size / 2**20:.1f}",
                ]
            )
    headers = ["operation", "wall s", "user s", "sys s", "wall ratio", "user ratio", "±", "MiB"]
    text = common.table(headers, rows)
    text += f"\n\n{result['parameters'] / 1e6:.1f} M parameters, AdamW state included."
    print(text)
    checks = [
        common.Check(
            "checkpoint: save vs bare torch.save",
            ratios["save"][0],
            SAVE_LIMIT,
            note=f"user CPU {ratios['save'][1]:.3f}x",
        ),
        common.Check(
            "checkpoint: load vs bare torch.load",
            ratios["load"][0],
            None,
            note=f"user CPU {ratios['load'][1]:.3f}x",
        ),
    ]
    return text, checks


def main():
    parser = common.out_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--dir", help="where the files go (default: the system temp dir)")
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(run_child(args.reps, args.dir)))
        return
    _, checks = run(args.reps, args.dir)
    print(common.checks_table(checks))


if __name__ == "__main__":
    main()
