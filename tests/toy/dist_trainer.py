"""The toy trainer with probes for multi-process tests.

It writes what each rank saw (its batches, its torch threads, the learning rate its config gave
it) to ``<save_dir>/probe_rank<r>.json`` when training ends, and can
inject faults chosen by project fields of the config: ``fault_nan_rank`` / ``fault_nan_from``
(a NaN loss on one rank from that iteration on), ``fault_crash_rank`` / ``fault_crash_at``
(an exception on one rank at that iteration), ``fault_sigterm_rank`` / ``fault_sigterm_at`` (that
rank signals itself SIGTERM at that iteration), ``fault_abort_at_exit_rank`` (that rank aborts
at interpreter exit, however its run ended, as gloo sometimes does), ``fault_stall_rank`` /
``fault_stall_at`` (one rank sleeps for good in that iteration, its peers waiting in the
gradient all-reduce), ``fault_gate_at`` / ``fault_gate`` (every rank says so and waits in that
iteration until the file ``fault_gate`` exists: a test's signal sent once it said so lands in
that iteration, however loaded the machine); ``ballast_mb`` adds that much extra state to every
checkpoint, so that writing one takes long enough to be interrupted, and ``iter_sleep_s`` slows
every iteration down, so that a signal sent after a few progress lines lands mid-run;
``probe_dir`` puts the probes and final weights there instead of save_dir (a URL, for object
storage). The FLOP count's extra step (under a dispatch mode) is neither probed nor faulted:
it is not a step of the run.
"""

import atexit
import json
import os
import signal
import sys
import time
from pathlib import Path

import ignite.distributed as idist
import torch
from ignite.engine import Events
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from gatle_ignite.trainer.strategy import is_sharded
from tests.toy.trainer import Trainer as ToyTrainer


class Ballast:
    def __init__(self, megabytes):
        self.tensor = torch.zeros(int(megabytes * 2**20 / 4))

    def state_dict(self):
        return {"tensor": self.tensor}

    def load_state_dict(self, state):
        self.tensor = state["tensor"]


class Trainer(ToyTrainer):
    def __init__(self, local_rank, cfg):
        super().__init__(local_rank, cfg)
        # From the start, so that a run refused before setup() aborts at exit too.
        if idist.get_rank() == cfg.get("fault_abort_at_exit_rank", -1):
            atexit.register(os.abort)

    def extra_to_save(self):
        megabytes = self.cfg.get("ballast_mb", 0)
        if not megabytes:
            return {}
        if not hasattr(self, "_ballast"):
            self._ballast = Ballast(megabytes)
        return {"ballast": self._ballast}

    def setup(self):
        if self._built:
            return self
        super().setup()
        self.probe = {"train_batches": [], "eval_batches": [], "allreduce_calls": 0}
        self._count_gradient_allreduces()
        self.engines["trainer"].add_event_handler(Events.COMPLETED, self._write_probe)
        if "run" in self.cfg:
            for key in ("evaluator", "tester"):
                if self.engines.get(key) is not None:
                    self.engines[key].add_event_handler(Events.COMPLETED, self._write_probe)
        return self

    def _count_gradient_allreduces(self):
        if is_sharded(self.model):
            self._count_reduce_scatters()
            return
        if not hasattr(self.model, "register_comm_hook"):
            return

        def counting_hook(state, bucket):
            self.probe["allreduce_calls"] += 1
            tensor = bucket.buffer().div_(idist.get_world_size())
            work = torch.distributed.all_reduce(tensor, async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0])

        self.model.register_comm_hook(None, counting_hook)

    def prep_batch(self, batch, split="train", **kwargs):
        if not is_in_torch_dispatch_mode():
            key = "train_batches" if split == "train" else "eval_batches"
            self.probe[key].append(len(batch[0]))
        return super().prep_batch(batch, split=split)

    def loss_fn(self, y_pred, target, **kwargs):
        loss, parts = super().loss_fn(y_pred, target, **kwargs)
        if is_in_torch_dispatch_mode():
            return loss, parts
        iteration, rank, cfg = kwargs["iteration"], idist.get_rank(), self.cfg
        if rank == cfg.get("fault_crash_rank", -1) and iteration == cfg.get("fault_crash_at"):
            raise RuntimeError(f"injected crash on rank {rank} at iteration {iteration}")
        if rank == cfg.get("fault_nan_rank", -1) and iteration >= cfg.get("fault_nan_from", 0):
            loss = loss * float("nan")
        if rank == cfg.get("fault_sigterm_rank", -1) and iteration == cfg.get("fault_sigterm_at"):
            os.kill(os.getpid(), signal.SIGTERM)
        if rank == cfg.get("fault_stall_rank", -1) and iteration == cfg.get("fault_stall_at"):
            print(f"injected stall on rank {rank} at iteration {iteration}", flush=True)
            while True:
                time.sleep(60)
        if iteration == cfg.get("fault_gate_at"):
            # One write with its newline: the ranks' lines must not run into one another.
            sys.stdout.write(f"waiting at the gate on rank {rank} at iteration {iteration}\n")
            sys.stdout.flush()
            while not os.path.exists(cfg.fault_gate):
                time.sleep(0.05)
        time.sleep(cfg.get("iter_sleep_s", 0))
        return loss, parts

    def _write_probe(self, engine):
        state = self.engines["trainer"].state
        record = dict(
            self.probe,
            rank=idist.get_rank(),
            world_size=idist.get_world_size(),
            epoch=state.epoch,
            iteration=state.iteration,
            train_sampler=type(getattr(self.dls["train"], "sampler", None)).__name__,
            env_rank=os.environ.get("RANK"),
            threads=torch.get_num_threads(),
            lr=self.cfg.optimizer_params.lr,
        )
        out = Path(self.cfg.get("probe_dir", None) or self.cfg.save_dir)
        out.mkdir(parents=True, exist_ok=True)
        rank = idist.get_rank()
        (out / f"probe_rank{rank}.json").write_text(json.dumps(record))
        # Full tensors on every rank (a collective under FSDP), written by rank 0.
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=full)
        if rank == 0:
            torch.save({k: v.detach().cpu() for k, v in weights.items()}, out / "final_weights.pt")

    def _count_reduce_scatters(self):
        """FSDP2 reduces a unit's gradients with one reduce-scatter; count them."""
        reduce_scatter = torch.distributed.reduce_scatter_single

        def counting(*args, **kwargs):
            if not is_in_torch_dispatch_mode():
                self.probe["reduce_scatter_calls"] += 1
            return reduce_scatter(*args, **kwargs)

        self.probe["reduce_scatter_calls"] = 0
        torch.distributed.reduce_scatter_single = counting
