"""Stage 2's trainer: the student learns from the labels and from a frozen teacher's logits."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import ignite.distributed as idist
import torch

from examples.teacher_student.configs.base_utils import REPO_ROOT, TEACHER_CONFIG, teacher_ckpt
from gatle_ignite import BaseTrainer, load_weights, to_device
from gatle_ignite.dispatch import import_entrypoint


def train_teacher():
    """Run stage 1 in a subprocess, exactly as a user would from the repository root."""
    exe = shutil.which("gatle-ignite")
    command = [exe] if exe else [sys.executable, "-m", "gatle_ignite"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    print(f"TEACHER MISSING: training it first with {TEACHER_CONFIG}")
    subprocess.run(
        [*command, "train", f"--config={TEACHER_CONFIG}"], cwd=REPO_ROOT, env=env, check=True
    )


def load_teacher(cfg, device):
    """Build the teacher from the project fields, load its weights, and freeze it."""
    Model = import_entrypoint(cfg.teacher_model_name, "Model", field="teacher_model_name")
    teacher = Model(**cfg.teacher_model_params)
    path = cfg.teacher_weights
    if not Path(path).is_file() and cfg.teacher_autotrain:
        train_teacher()
        path = teacher_ckpt()
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"no teacher checkpoint at {path}. Train it first: "
            f"gatle-ignite train --config={TEACHER_CONFIG}"
        )
    load_weights(path, teacher, strict=True)
    # eval(): no dropout or batch-norm updates; requires_grad_(False): nothing can train it.
    return teacher.to(device).eval().requires_grad_(False)


class Trainer(BaseTrainer):
    """Adds the teacher's logits to the targets of every split."""

    def build_model(self):
        student = super().build_model()
        # Kept beside the student, never as model.teacher: a registered submodule is switched
        # to train mode with the student, optimised once trainable, and checkpointed. The list
        # keeps it unregistered even if this holder ever becomes an nn.Module.
        self._teacher = [load_teacher(self.cfg, idist.device())]
        return student

    @property
    def teacher(self):
        return self._teacher[0]

    def prep_batch(self, batch, split="train", **kwargs):
        x, y = to_device(batch, self.device)
        with torch.no_grad():
            teacher_logits = self.teacher(x)["logits"].detach()
        targets = {"labels": y, "teacher_logits": teacher_logits}
        return {"model_input": {"x": x}, "targets": targets}
