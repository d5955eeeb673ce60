"""Verify the distillation: the teacher is trained, frozen, outside the student, and untouched.

Run from the repository root, after training (the teacher at least)::

    python examples/teacher_student/scripts/verify.py
    python -m examples.teacher_student.scripts.verify

It builds the student config's trainer with ``max_epochs=12``, no checkpoint writing and a run
directory of its own (the real run's files stay as they are), inspects the teacher, trains, and
inspects it again.
``main()`` returns the exit code instead of exiting, because ``negative_controls.py`` calls it.
"""

import hashlib
import shutil
import sys
from pathlib import Path

# Run as a file, the script's own folder heads sys.path instead of the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from ignite.engine import Events

from gatle_ignite.config.loader import load_config_from_file
from gatle_ignite.dispatch import import_entrypoint

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "teacher_student_v0.py"
TRAIN_COMMAND = "gatle-ignite train --config=examples/teacher_student/configs/teacher_student_v0.py"
MAX_EPOCHS = 12
VERIFY_DIR = Path(__file__).resolve().parents[1] / "checkpoints" / "verify"

MIN_TEACHER_ACC = 0.5
MAX_FRESH_ACC = 0.25
MAX_TEACHER_CONFIDENCE = 0.99
CHANCE_FACTOR = 1.5


class Report:
    """Collects PASS / FAIL lines and prints the tally."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, observed):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {observed}")

    def finish(self):
        print(f"\n{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def fingerprint(module):
    """A hash of every tensor in ``module``'s state dict."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


@torch.no_grad()
def score(model, loader):
    """``(accuracy, mean max-softmax)`` of ``model`` on ``loader``, leaving its mode alone."""
    correct = total = 0
    confidence = 0.0
    for x, y in loader:
        logits = model(x)["logits"]
        correct += int((logits.argmax(dim=1) == y).sum())
        confidence += float(torch.softmax(logits, dim=1).max(dim=1).values.sum())
        total += len(y)
    return correct / total, confidence / total


def fresh_teacher(cfg):
    """A never-trained teacher, the baseline the loaded one must beat."""
    Model = import_entrypoint(cfg.teacher_model_name, "Model", field="teacher_model_name")
    # A forked RNG, so building it does not shift the shuffles of the training that follows.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return Model(**cfg.teacher_model_params)


def check_frozen_teacher(report, task, cfg):
    """Everything that can be checked before training."""
    teacher, student = task.teacher, task.model
    fresh = fresh_teacher(cfg)
    loaded_print, fresh_print = fingerprint(teacher), fingerprint(fresh)
    report.check(
        "teacher differs from a fresh init",
        loaded_print != fresh_print,
        f"{loaded_print} vs fresh {fresh_print}",
    )

    acc, confidence = score(teacher, task.dls["valid"])
    fresh_acc, _ = score(fresh, task.dls["valid"])
    report.check(
        f"loaded teacher acc > {MIN_TEACHER_ACC}, fresh-init acc < {MAX_FRESH_ACC}",
        acc > MIN_TEACHER_ACC and fresh_acc < MAX_FRESH_ACC,
        f"loaded {acc:.4f}, fresh {fresh_acc:.4f}",
    )
    report.check(
        f"teacher mean max-softmax < {MAX_TEACHER_CONFIDENCE}",
        confidence < MAX_TEACHER_CONFIDENCE,
        f"{confidence:.4f}",
    )

    teacher_ids = {id(p) for p in teacher.parameters()}
    student_ids = {id(p) for p in student.parameters()}
    optimised = {id(p) for group in task.optimizer.param_groups for p in group["params"]}
    leaked = len(optimised & teacher_ids)
    report.check("no teacher parameter in the optimizer", leaked == 0, f"{leaked} found")
    report.check(
        "optimizer parameters are a non-empty subset of the student's",
        bool(optimised) and optimised <= student_ids,
        f"{len(optimised)} optimised, {len(optimised - student_ids)} outside the student",
    )
    trainable = sum(p.requires_grad for p in teacher.parameters())
    report.check(
        "every teacher parameter has requires_grad False", trainable == 0, f"{trainable} trainable"
    )
    inside = any(module is teacher for module in student.modules())
    report.check("the teacher is not a student submodule", not inside, f"inside: {inside}")


def check_training_leaves_teacher_alone(report, task):
    """Train with a per-iteration probe on the teacher, then compare it with its snapshot."""
    teacher = task.teacher
    before_print = fingerprint(teacher)
    before = {k: v.detach().clone() for k, v in teacher.state_dict().items()}
    seen = {"iterations": 0, "train_mode": 0, "with_grad": 0}

    def probe(engine):
        seen["iterations"] += 1
        seen["train_mode"] += int(teacher.training)
        seen["with_grad"] += int(any(p.grad is not None for p in teacher.parameters()))

    task.engines["trainer"].add_event_handler(Events.ITERATION_COMPLETED, probe)
    task.fit()

    after_print = fingerprint(teacher)
    report.check(
        "teacher fingerprint unchanged by training",
        after_print == before_print,
        f"{before_print} -> {after_print}",
    )
    after = teacher.state_dict()
    delta = max(float((after[k] - v).abs().max()) for k, v in before.items())
    report.check("max |delta| over teacher tensors == 0.0", delta == 0.0, f"{delta:.3e}")
    n = seen["iterations"]
    report.check(
        "no iteration had the teacher in train mode",
        n > 0 and seen["train_mode"] == 0,
        f"{seen['train_mode']}/{n}",
    )
    report.check(
        "no iteration left a teacher gradient",
        n > 0 and seen["with_grad"] == 0,
        f"{seen['with_grad']}/{n}",
    )


def main(argv=None):
    """Run the 12 checks; returns 0 when all pass, else 1."""
    cfg = load_config_from_file(str(CONFIG))
    if not Path(cfg.teacher_weights).is_file():
        print(f"no teacher checkpoint ({cfg.teacher_weights}).")
        print(f"  Train first: {TRAIN_COMMAND}")
        return 1
    cfg.max_epochs = MAX_EPOCHS
    cfg.save_ckpt = False
    # A run directory of its own: the student's holds the real run.
    cfg.save_dir = str(VERIFY_DIR)
    shutil.rmtree(VERIFY_DIR, ignore_errors=True)

    trainer_cls = import_entrypoint(cfg.main_runner, "Trainer", field="main_runner")
    task = trainer_cls(0, cfg).setup()
    report = Report()
    print(f"\nchecks for {cfg.name}, teacher from {cfg.teacher_weights}")
    check_frozen_teacher(report, task, cfg)
    check_training_leaves_teacher_alone(report, task)

    acc = float(task.engines["evaluator"].state.metrics["valid/acc"])
    floor = CHANCE_FACTOR / cfg.model_params.n_classes
    report.check(
        f"student valid/acc > {CHANCE_FACTOR} x chance ({floor:.4f})", acc > floor, f"{acc:.4f}"
    )
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
