"""Break the example four ways and confirm that ``verify.py`` catches every one.

Run from the repository root, after training the teacher::

    python examples/teacher_student/scripts/negative_controls.py

Each scenario runs in its own subprocess, which patches the example and then calls
``verify.main()``; a scenario is caught when that returns non-zero. The unpatched example runs
first and must pass, or a "caught" would mean nothing. Exits 0 only if all four were caught.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

# Run as a file, the script's own folder heads sys.path instead of the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


from examples.teacher_student.configs.base_utils import REPO_ROOT
from examples.teacher_student.losses.loss_functions import kd_loss
from examples.teacher_student.scripts import verify
from examples.teacher_student.trainer import student_trainer
from gatle_ignite import get_value, to_device
from gatle_ignite.dispatch import import_entrypoint

MARKER = "VERIFY_RETURNED="


def never_loaded_teacher(cfg, device):
    """``load_teacher`` that skips the weights: a frozen, untrained teacher."""
    Model = import_entrypoint(cfg.teacher_model_name, "Model", field="teacher_model_name")
    return Model(**cfg.teacher_model_params).to(device).eval().requires_grad_(False)


def patch_untrained():
    student_trainer.load_teacher = never_loaded_teacher


def patch_submodule(trainable=False):
    """Register the teacher as ``model.teacher``, the mistake the list in build_model avoids."""
    original = student_trainer.Trainer.build_model

    def build_model(self):
        model = original(self)
        if trainable:
            self.teacher.requires_grad_(True)
        model.teacher = self.teacher
        return model

    student_trainer.Trainer.build_model = build_model


def patch_leak_grad():
    patch_submodule(trainable=True)


def patch_total_leak():
    """Also compute the teacher's logits with autograd on and never detach them."""
    patch_leak_grad()

    def prep_batch(self, batch, split="train", **kwargs):
        x, y = to_device(batch, self.device)
        targets = {"labels": y, "teacher_logits": self.teacher(x)["logits"]}
        return {"model_input": {"x": x}, "targets": targets}

    def forward(self, y_pred, target, iteration=None):
        student = get_value(y_pred, self.src_name)
        return kd_loss.kd_divergence(student, get_value(target, self.tgt_name), self.temperature)

    student_trainer.Trainer.prep_batch = prep_batch
    kd_loss.Loss.forward = forward


SCENARIOS = {
    "untrained": patch_untrained,
    "submodule": patch_submodule,
    "leak_grad": patch_leak_grad,
    "total_leak": patch_total_leak,
}


def run_scenario(name):
    """In a child: patch, verify, and print what verify returned."""
    if name != "clean":
        SCENARIOS[name]()
    returned = verify.main()
    print(f"{MARKER}{returned}")
    return 0


def spawn(name):
    """Run one scenario in a subprocess; returns verify's code, or None if the child crashed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "examples.teacher_student.scripts.negative_controls"]
    result = subprocess.run(
        [*command, "--scenario", name], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    lines = result.stdout.splitlines()
    for line in lines:
        if line.startswith("FAIL"):
            print(f"    {line}")
    codes = [line[len(MARKER) :] for line in lines if line.startswith(MARKER)]
    if not codes:
        print(f"    the child crashed (exit {result.returncode}):")
        print("\n".join(f"    {line}" for line in result.stderr.splitlines()[-5:]))
        return None
    return int(codes[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["clean", *SCENARIOS], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scenario:
        return run_scenario(args.scenario)

    cfg = verify.load_config_from_file(str(verify.CONFIG))
    if not Path(cfg.teacher_weights).is_file():
        print(f"no teacher checkpoint ({cfg.teacher_weights}).")
        print(f"  Train first: {verify.TRAIN_COMMAND}")
        return 1

    print("baseline: the unpatched example")
    if spawn("clean") != 0:
        print("[FAIL] the unpatched example does not pass verify.py, so no control means anything")
        return 1
    print("[OK]   baseline passes verify.py")

    caught = 0
    for name in SCENARIOS:
        print(f"scenario {name}")
        returned = spawn(name)
        ok = returned not in (None, 0)
        caught += ok
        print(f"{'[OK]  ' if ok else '[MISS]'} {name}: verify.main() returned {returned}")
    print(f"\n{caught} caught, {len(SCENARIOS) - caught} missed")
    return 0 if caught == len(SCENARIOS) else 1


if __name__ == "__main__":
    sys.exit(main())
