"""Settings both stages share: paths, model sizes, data splits, and where the teacher lives."""

from pathlib import Path

from gatle_ignite.utils.checkpoints import find_best_checkpoint

PROJECT_ROOT = Path(__file__).resolve().parent.parent
REPO_ROOT = PROJECT_ROOT.parent.parent
TEACHER_CONFIG = "examples/teacher_student/configs/teacher_v0.py"

IN_DIM = 32
N_CLASSES = 8
CHECKPOINTS = PROJECT_ROOT / "checkpoints"
TEACHER_DIR = CHECKPOINTS / "teacher"
STUDENT_DIR = CHECKPOINTS / "student"

# 76,296 parameters against 664: the student cannot match the teacher on its own data.
TEACHER_PARAMS = {"in_dim": IN_DIM, "hidden": 256, "depth": 2, "n_classes": N_CLASSES}
STUDENT_PARAMS = {"in_dim": IN_DIM, "hidden": 16, "depth": 1, "n_classes": N_CLASSES}

DS_COMMON = {"in_dim": IN_DIM, "n_classes": N_CLASSES, "num_workers": 0}
TEACHER_TRAIN = {**DS_COMMON, "n": 16384, "seed": 0, "bs": 256, "shuffle": True, "drop_last": True}
# Small and drawn from another seed, so the student never sees the teacher's training data.
STUDENT_TRAIN = {**DS_COMMON, "n": 256, "seed": 7, "bs": 64, "shuffle": True, "drop_last": True}
VALID = {**DS_COMMON, "n": 2048, "seed": 99, "bs": 512, "shuffle": False}

MISSING_TEACHER = TEACHER_DIR / "MISSING_train_the_teacher_first.pt"


def teacher_ckpt():
    """The teacher's best checkpoint (largest trailing score), or a placeholder path."""
    best = find_best_checkpoint(TEACHER_DIR, prefix="valid_")
    return str(best if best is not None else MISSING_TEACHER)
