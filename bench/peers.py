"""The same task as a bare loop, gatle-ignite, Lightning and Accelerate, side by side.

    python -m bench.peers --setup           # once: its own environment, .venv-peers/
    python -m bench.peers [--reps 6]

The task is the synthetic example's: its MLP and data (2048 x 64, batch 64, shuffled), AdamW,
20 epochs from seed 42, one torch thread, a checkpoint (model and optimizer) written at every
epoch's end, no progress bar and no logger. Each variant runs in its own fresh process, the
variants interleaved in a rotated order, every one in the same environment: ``--setup`` makes
``.venv-peers`` with torch, Lightning, Accelerate and this checkout (``pip install -e .``), so
none of them is ever a dependency of gatle-ignite or its tests.

Each process reports two CPU figures (``time.process_time``, which other work on the cores does
not inflate): per iteration, the fastest epoch after the first (epoch start to next epoch start,
so its checkpoint is in it); and from the process's start to its first step. Ratios are taken
against the bare loop of the same repetition, and the table shows their medians.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

VERSIONS = {"torch": "2.13.0", "lightning": "2.6.6", "accelerate": "1.16.0"}
ENV_DIR = common.ROOT / ".venv-peers"
VARIANTS = {
    "bare": "bare PyTorch loop",
    "gatle": "gatle-ignite",
    "lightning": f"Lightning {VERSIONS['lightning']}",
    "accelerate": f"Accelerate {VERSIONS['accelerate']}",
}
# gatle-ignite as the others run: a checkpoint per epoch, no evaluation, progress or logger.
GATLE_OVERRIDES = ("logger_name=[]", "every_val=0", "score_name=None", "verbosity=0")


# ---- in a child process ----


class Clock:
    """CPU time at each epoch's start and at the end; and at the first step."""

    def __init__(self):
        self.epochs, self.first_step = [], None

    def epoch(self):
        self.epochs.append(time.process_time())

    def step(self):
        if self.first_step is None:
            self.first_step = time.process_time()

    def result(self, final_loss):
        per_epoch = [b - a for a, b in zip(self.epochs[1:], self.epochs[2:])]
        return {
            "per_iteration": min(per_epoch) / common.ITERS_PER_EPOCH,
            "first_step": self.first_step,
            "final_loss": final_loss,
        }


def _task():
    """Seed, data, model, optimizer, as the example draws them, with torch alone."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(common.SEED)
    weights = torch.randn(64, 10, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(common.TRAIN_N, 64, generator=torch.Generator().manual_seed(0))
    dataset = TensorDataset(x, (x @ weights).argmax(dim=1))
    loader = DataLoader(dataset, batch_size=common.BATCH, shuffle=True, drop_last=True)
    model = common.mlp()
    return dataset, loader, model, common.adamw(model)


def _final_loss(model, dataset):
    return common.final_loss(model, dataset.tensors)


def run_bare(clock, save_dir):
    import torch

    dataset, loader, model, optimizer = _task()
    for _epoch in range(common.EPOCHS):
        clock.epoch()
        for x, y in loader:
            clock.step()
            common.bare_step(model, optimizer, x, y)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, Path(save_dir) / "latest.pt")
    clock.epoch()
    return _final_loss(model, dataset)


def run_accelerate(clock, save_dir):
    import torch.nn.functional as F
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    dataset, loader, model, optimizer = _task()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _epoch in range(common.EPOCHS):
        clock.epoch()
        for x, y in loader:
            clock.step()
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()
        accelerator.save_state(str(Path(save_dir) / "latest"))
    clock.epoch()
    return _final_loss(accelerator.unwrap_model(model), dataset)


def run_lightning(clock, save_dir):
    import lightning as L
    import torch.nn.functional as F
    from lightning.pytorch.callbacks import ModelCheckpoint

    dataset, loader, model, optimizer = _task()

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, _index):
            clock.step()
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self):
            return optimizer

    class Stamps(L.Callback):
        def on_train_epoch_start(self, *_args):
            clock.epoch()

        def on_train_end(self, *_args):
            clock.epoch()

    trainer = L.Trainer(
        max_epochs=common.EPOCHS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=save_dir,
        callbacks=[Stamps(), ModelCheckpoint(dirpath=save_dir, every_n_epochs=1)],
    )
    trainer.fit(Module(), loader)
    return _final_loss(model, dataset)


def run_gatle(clock, save_dir):
    """``gatle-ignite train`` in this process, the bench trainer stamping its epochs."""
    from gatle_ignite.cli.main import main

    record = Path(save_dir) / "record.json"
    os.environ.update({common.RECORD_ENV: str(record), common.FIRST_ITERATION_ENV: "1"})
    items = [f"save_dir={save_dir}/run", *GATLE_OVERRIDES]
    code = main(["train", f"--config={common.CONFIG}", *(f"--override={i}" for i in items)])
    if code != 0:
        raise SystemExit(code)
    stamps = json.loads(record.read_text())
    # The bench trainer stamps epoch ends; the first epoch's start is its first step.
    clock.first_step = stamps["first_iteration_cpu"]
    clock.epochs = [stamps["first_iteration_cpu"], *(cpu for _wall, cpu in stamps["train"])]
    return stamps["final_loss"]


CHILDREN = {
    "bare": run_bare,
    "gatle": run_gatle,
    "lightning": run_lightning,
    "accelerate": run_accelerate,
}


def child(variant, _args):
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="gatle-bench-peers-") as tmp:
        final_loss = CHILDREN[variant](clock, tmp)
    return clock.result(final_loss)


# ---- the parent ----


def _python():
    return ENV_DIR / "bin" / "python"


def setup():
    """Make ``.venv-peers``: torch, Lightning, Accelerate and this checkout, pinned."""
    if not _python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(ENV_DIR)], check=True)
    pip = [str(_python()), "-m", "pip", "install"]
    # torch first, pinned, so that neither peer pulls another build.
    subprocess.run([*pip, f"torch=={VERSIONS['torch']}"], check=True)
    peers = [f"{name}=={VERSIONS[name]}" for name in ("lightning", "accelerate")]
    subprocess.run([*pip, *peers, "-e", str(common.ROOT)], check=True)


def _run_child(variant):
    with tempfile.TemporaryDirectory(prefix="gatle-bench-") as tmp:
        out = Path(tmp) / "result.json"
        command = [str(_python()), "-m", "bench.peers", "--child", variant, "--out", str(out)]
        proc = subprocess.run(
            command, cwd=common.ROOT, env=common.child_env(), capture_output=True, timeout=900
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr).decode(errors="replace")[-4000:]
            raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def run(reps=None, setup_env=False):
    """Measure and print the table; the peers' figures are information, not checks."""
    if setup_env:
        setup()
        return "", []
    if not _python().exists():
        raise SystemExit("no .venv-peers yet: run `python -m bench.peers --setup` first")
    print("== gatle-ignite, Lightning and Accelerate against a bare loop ==")
    print(f"  load average {os.getloadavg()[0]:.1f} at start, {os.cpu_count()} cores")
    results = common.interleaved("bench.peers", list(VARIANTS), reps or 6, run=_run_child)
    rows, checks = [], []
    bare = results["bare"]
    for name, values in results.items():
        ratios = [
            common.paired_ratio([v[key] for v in values], [b[key] for b in bare])
            for key in ("per_iteration", "first_step")
        ]
        per_iteration = common.median([v["per_iteration"] for v in values])
        first_step = common.median([v["first_step"] for v in values])
        spread = common.spread(
            [v["per_iteration"] / b["per_iteration"] for v, b in zip(values, bare)]
        )
        rows.append(
            [
                VARIANTS[name],
                f"{per_iteration * 1e6:.0f}",
                f"{ratios[0]:.2f}x",
                f"{spread:.0f}%",
                f"{first_step:.2f}",
                f"{ratios[1]:.2f}x",
                f"{common.median([v['final_loss'] for v in values]):.4f}",
            ]
        )
        if name != "bare":
            label = f"peers: {VARIANTS[name]}, CPU per iteration vs a bare loop"
            checks.append(common.Check(label, ratios[0], None))
    headers = [
        "variant",
        "CPU us/iter",
        "ratio",
        "±",
        "CPU s to first step",
        "ratio",
        "final loss",
    ]
    text = common.table(headers, rows)
    print(text)
    return text, checks


if __name__ == "__main__":
    options = [
        ("--setup", {"dest": "setup_env", "action": "store_true", "help": "make .venv-peers"})
    ]
    common.main(__doc__, run, child, options)
