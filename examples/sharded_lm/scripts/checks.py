"""Verification for the sharded_lm example: what the run learned, and its sharded checkpoints.

Run from the repository root, after training::

    gatle-ignite train --config=examples/sharded_lm/configs/sharded_lm_v0.py
    python -m examples.sharded_lm.scripts.checks

It reads the run's ``metrics.csv`` and checkpoint directories, consolidates the best one into a
temporary ``.pt`` with ``gatle-ignite consolidate``, and evaluates both with ``gatle-ignite
eval``. Exits 0 only when no check failed.
"""

import csv
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from examples.sharded_lm.dataloaders.data_utils.markov import oracle_nll, transition_matrix
from examples.sharded_lm.dataloaders.markov_text import split_tokens
from gatle_ignite.callbacks.backends.text import format_value
from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.run.sharded import ShardedCheckpoint

ROOT = Path(__file__).resolve().parents[3]
CONFIG = "examples/sharded_lm/configs/sharded_lm_v0.py"
TRAIN_COMMAND = f"gatle-ignite train --config={CONFIG}"

# The final training loss must fall below this fraction of ln(vocab), the uniform guess.
MAX_LOSS_FRACTION = 0.4
# The best validation loss must come within this many nats of the chain's own entropy...
MAX_GAP_TO_FLOOR = 0.15
# ...and may not go below it by more than sampling noise: only a model that sees the token it
# predicts (a leaking causal mask) beats the chain that generated the text.
FLOOR_NOISE = 0.02
# Each of the 2 ranks' files holds this share of the model's elements, give or take.
HALF, HALF_TOLERANCE = 0.5, 0.05
LATEST_RE = re.compile(r"^latest_epoch_checkpoint_(\d+)\.dcp$")
BEST_RE = re.compile(r"^valid_best_result_checkpoint_(\d+)_(-?[\d.]+)\.dcp$")
METRIC_LINE = re.compile(r"^(valid/\w+): (\S+)$", re.MULTILINE)


class Tally:
    """PASS / FAIL lines with the observed values, and the exit code they add up to."""

    def __init__(self):
        self.failed = 0
        self.passed = 0

    def check(self, name: str, ok: bool, observed) -> bool:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {observed}")
        self.passed += bool(ok)
        self.failed += not ok
        return ok

    def finish(self) -> int:
        print(f"\n{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def history(save_dir: Path) -> dict:
    """``{metric name: [value per epoch]}`` from the run's ``metrics.csv``."""
    values = defaultdict(dict)
    with open(save_dir / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["name"] in ("train/loss_avg", "valid/ppl"):
                values[row["name"]][int(row["epoch"])] = float(row["value"])
    return {name: [by_epoch[e] for e in sorted(by_epoch)] for name, by_epoch in values.items()}


def baselines(cfg) -> dict:
    """Mean next-token loss (nats) on the validation split of three predictors that need no
    training: uniform, the bigram table counted on the training split, and the chain itself."""
    train = split_tokens(cfg.train_ds_params)
    valid = split_tokens(cfg.valid_ds_params)
    params = cfg.valid_ds_params
    vocab = params["vocab"]
    counts = torch.ones(vocab, vocab)  # add-one, so a pair unseen in training costs finitely
    pairs = (train[:, :-1].reshape(-1), train[:, 1:].reshape(-1))
    counts.index_put_(pairs, torch.ones(pairs[0].numel()), accumulate=True)
    bigram = (counts / counts.sum(dim=1, keepdim=True)).log()
    matrix = transition_matrix(vocab, params["successors"], params["task_seed"])
    return {
        "uniform": math.log(vocab),
        "bigram": float(-bigram[valid[:, :-1], valid[:, 1:]].mean()),
        "chain": oracle_nll(valid, matrix),
    }


def check_learning(tally: Tally, cfg, curves: dict, best_ppl: float) -> None:
    """The loss fell far below the uniform guess, past the bigram table, close to the floor."""
    floor = baselines(cfg)
    print(
        "       valid loss (nats) of the baselines: "
        + ", ".join(f"{name} {value:.4f}" for name, value in floor.items())
    )
    losses = curves.get("train/loss_avg", [])
    tally.check(f"epochs trained == {cfg.max_epochs}", len(losses) == cfg.max_epochs, len(losses))
    if not losses:
        return
    limit = MAX_LOSS_FRACTION * floor["uniform"]
    tally.check(
        f"final train/loss_avg < {MAX_LOSS_FRACTION} x ln(vocab)",
        losses[-1] < limit,
        f"{losses[-1]:.4f} (epoch 1: {losses[0]:.4f}) vs {limit:.4f}",
    )
    nll = math.log(best_ppl)
    tally.check(
        "best valid loss < the bigram table's (the model reads the token two back)",
        nll < floor["bigram"],
        f"ln(ppl {best_ppl:.4f}) = {nll:.4f} vs {floor['bigram']:.4f}",
    )
    tally.check(
        f"best valid loss within {MAX_GAP_TO_FLOOR} nats above the chain's own",
        floor["chain"] - FLOOR_NOISE <= nll < floor["chain"] + MAX_GAP_TO_FLOOR,
        f"{nll:.4f} vs {floor['chain']:.4f} (gap {nll - floor['chain']:+.4f})",
    )


def find(save_dir: Path, pattern) -> list:
    return sorted(p for p in save_dir.iterdir() if pattern.match(p.name))


def check_files(tally: Tally, save_dir: Path, max_epochs: int) -> None:
    """Every checkpoint is a complete ``.dcp`` directory; no ``.pt`` was written."""
    latest = [p.name for p in find(save_dir, LATEST_RE)]
    best = [p.name for p in find(save_dir, BEST_RE)]
    tally.check(
        f"latest_epoch_checkpoint_{max_epochs}.dcp and a best .dcp exist",
        f"latest_epoch_checkpoint_{max_epochs}.dcp" in latest and bool(best),
        latest + best,
    )
    for name in latest + best:
        try:
            ShardedCheckpoint(save_dir / name)
            ok, observed = (save_dir / name).is_dir(), "a directory; its metadata and shard files"
        except Exception as error:  # an unreadable checkpoint is a failed check, not a crash
            ok, observed = False, repr(error)
        tally.check(f"{name} is a complete sharded checkpoint", ok, observed)
    files = sorted(p.name for p in save_dir.glob("*.pt"))
    tally.check("no .pt checkpoint in save_dir", not files, files or "none")


def elements_per_file(checkpoint: ShardedCheckpoint, entry: str) -> dict:
    """``{shard file: elements of entry's tensors stored in it}``, from the checkpoint's
    metadata: which rank wrote which slice of every tensor."""
    metadata = checkpoint.metadata
    totals = defaultdict(int)
    for index, info in metadata.storage_data.items():
        item = metadata.state_dict_metadata[index.fqn]
        if metadata.planner_data[index.fqn][0] == entry and hasattr(item, "chunks"):
            chunk = next(c for c in item.chunks if c.offsets == index.offset)
            totals[info.relative_path] += math.prod(chunk.sizes)
    return dict(totals)


def check_sharded(tally: Tally, best: Path) -> None:
    """Each rank held half of every parameter: the checkpoint stores each as two slices, one in
    each rank's file. (This reads the layout at save time, which is the layout of training:
    FSDP2 keeps every parameter sharded between steps.)"""
    checkpoint = ShardedCheckpoint(best)
    metadata = checkpoint.metadata
    model = [fqn for fqn, path in metadata.planner_data.items() if path[0] == "model"]
    split = [fqn for fqn in model if len(metadata.state_dict_metadata[fqn].chunks) == 2]
    tally.check(
        "every model tensor is stored in 2 slices",
        bool(model) and len(split) == len(model),
        f"{len(split)} of {len(model)}",
    )
    for entry in ("model", "optimizer"):
        per_file = elements_per_file(checkpoint, entry)
        total = sum(per_file.values())
        shares = {name: count / total for name, count in sorted(per_file.items())}
        tally.check(
            f"{entry}: each of the 2 ranks' files holds {HALF:.0%} +- {HALF_TOLERANCE:.0%}",
            len(shares) == 2 and all(abs(s - HALF) <= HALF_TOLERANCE for s in shares.values()),
            ", ".join(f"{name} {per_file[name]:,} ({s:.1%})" for name, s in shares.items()),
        )


def gatle(*args) -> subprocess.CompletedProcess:
    """``gatle-ignite ARGS`` from the repository root, as a user runs it."""
    command = [sys.executable, "-m", "gatle_ignite", *args]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)


def evaluate(checkpoint: Path, *overrides) -> dict:
    """The ``valid/*`` metrics ``gatle-ignite eval`` prints for ``checkpoint``."""
    done = gatle("eval", f"--config={CONFIG}", "--ckpt", str(checkpoint), *overrides)
    if done.returncode != 0:
        # No metrics: the checks that compare them fail, with this output above them.
        print(f"       eval of {checkpoint.name} failed:\n{done.stderr[-2000:]}")
        return {}
    return {name: float(value) for name, value in METRIC_LINE.findall(done.stdout)}


def check_consolidated(tally: Tally, best: Path, recorded_ppl: float) -> None:
    """``consolidate`` writes one plain file that evaluates as the sharded original does."""
    with tempfile.TemporaryDirectory(prefix="sharded_lm-") as tmp:
        out = Path(tmp) / "best.pt"
        done = gatle("consolidate", str(best), str(out))
        said = (done.stdout + done.stderr).strip().splitlines() or [""]
        if not tally.check("gatle-ignite consolidate exits 0", done.returncode == 0, said[-1]):
            return
        shapes = {
            fqn[len("model.") :]: tuple(item.size)
            for fqn, item in ShardedCheckpoint(best).metadata.state_dict_metadata.items()
            if fqn.startswith("model.")
        }
        try:
            state = torch.load(out, map_location="cpu", weights_only=True)
            loaded = {key: tuple(value.shape) for key, value in state["model"].items()}
        except Exception as error:  # a file that does not load is a failed check
            tally.check(f"{out.name} loads with weights_only=True", False, repr(error))
            return
        tally.check(
            f"{out.name} loads with weights_only=True, full tensors of every parameter",
            loaded == shapes,
            f"{len(loaded)} model tensors, e.g. embed.weight {loaded.get('embed.weight')}",
        )
        sharded = evaluate(best)
        whole = evaluate(out)
        alone = evaluate(out, "--override", "nproc_per_node=1")
    print(f"       eval {best.name}, 2 ranks: {sharded}")
    print(f"       eval {out.name}, 2 ranks: {whole}")
    print(f"       eval {out.name}, 1 process: {alone}")
    # eval prints 5 significant digits; the recorded value is compared as eval would print it.
    shown_ppl = float(format_value(recorded_ppl))
    tally.check(
        "the sharded best evaluates to the valid/ppl the run recorded (as eval prints it)",
        sharded.get("valid/ppl") == shown_ppl,
        f"{sharded.get('valid/ppl')} vs {recorded_ppl}",
    )
    tally.check(
        "the consolidated .pt evaluates as the sharded original (2 ranks each)",
        bool(sharded) and whole == sharded,
        f"valid/ppl {whole.get('valid/ppl')} vs {sharded.get('valid/ppl')}",
    )
    tally.check(
        "the consolidated .pt in one process: every metric as the sharded original",
        bool(sharded) and alone == sharded,
        f"{alone} vs {sharded}",
    )


def main() -> int:
    """Run every check on the trained run, print the tally; returns the exit code."""
    cfg = load_config_from_file(str(ROOT / CONFIG))
    save_dir = Path(cfg.save_dir)
    if not (save_dir / "metrics.csv").is_file():
        print(f"no trained run in {save_dir} (no metrics.csv).")
        print(f"  Train first: {TRAIN_COMMAND}")
        return 1
    tally = Tally()
    print(f"checks for {cfg.name} in {save_dir}")
    check_files(tally, save_dir, cfg.max_epochs)
    best = find(save_dir, BEST_RE)
    if not tally.check("a best .dcp to check further", bool(best), "found" if best else "none"):
        return tally.finish()
    best = max(best, key=lambda path: float(BEST_RE.match(path.name).group(2)))
    print(f"       best: {best.name}")
    curves = history(save_dir)
    recorded_ppl = curves["valid/ppl"][int(BEST_RE.match(best.name).group(1)) - 1]
    check_learning(tally, cfg, curves, recorded_ppl)
    check_sharded(tally, best)
    check_consolidated(tally, best, recorded_ppl)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
