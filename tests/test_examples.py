"""Every shipped example: its configs resolve, and one short epoch trains (EXAMPLES.md 0)."""

import ast
import io
import os
import re
import subprocess
import sys
import tokenize

import pytest

from gatle_ignite.cli.main import main
from tests.conftest import HANG_S, ROOT

CONFIGS = sorted(
    path.relative_to(ROOT).as_posix()
    for path in (ROOT / "examples").glob("*/configs/*.py")
    if path.name not in ("__init__.py", "base_utils.py") and not path.stem.endswith("_sweep")
)
SWEEPS = sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*/configs/*_sweep.py")
)
# teacher_student needs a trained teacher first, so EXAMPLES.md exempts it from the smoke run.
SMOKED = [c for c in CONFIGS if "/teacher_student/" not in c]
SMOKE = ["--override=max_epochs=1", "--override=train_length=2", "--override=val_length=2"]


def _cli(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gatle_ignite", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=env,
    )


def test_every_example_ships_its_configs():
    examples = {c.split("/")[1] for c in CONFIGS}
    assert examples == {
        "synthetic",
        "classification",
        "contrastive",
        "diffusion",
        "ema",
        "gan",
        "digits",
        "teacher_student",
        "translation",
        "templates",
        "sharded_lm",
        "causal_lm",
        "resnet_digits",
    }
    assert "examples/teacher_student/configs/teacher_v0.py" in CONFIGS


def test_every_config_resolves_its_dotted_paths():
    done = _cli("config", "--config=" + ",".join(CONFIGS))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("all dotted paths resolve.") == len(CONFIGS)


@pytest.mark.parametrize("sweep_file", SWEEPS)
def test_every_example_sweep_passes_the_sweeps_checks(sweep_file, monkeypatch):
    pytest.importorskip("optuna", reason="the sweep extra is not installed")
    from gatle_ignite.sweep.checks import check_sweep
    from gatle_ignite.sweep.definition import load_sweep_file, merge

    monkeypatch.chdir(ROOT)
    checked = check_sweep(merge({}, load_sweep_file(sweep_file)))
    assert checked.sweep.trials >= 1 and checked.record.metric


def test_the_synthetic_example_ships_a_sweep():
    assert SWEEPS == ["examples/synthetic/configs/synthetic_sweep.py"]


@pytest.mark.slow
@pytest.mark.parametrize("config", SMOKED)
def test_every_example_trains_one_short_epoch(config, tmp_path):
    done = _cli("train", f"--config={config}", *SMOKE, f"--override=save_dir={str(tmp_path)!r}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "TRAINING COMPLETE after " in done.stdout and "epoch 1/1 " in done.stdout
    # .pt, or a .dcp directory from an example that shards (sharded_lm).
    assert list(tmp_path.glob("latest_epoch_checkpoint_1.*"))


@pytest.mark.slow
def test_the_synthetic_example_trains_two_epochs_from_the_source_tree(tmp_path):
    config = "--config=examples/synthetic/configs/synthetic_v0.py"
    done = _cli(
        "train", config, "--override=max_epochs=2", f"--override=save_dir={str(tmp_path)!r}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRAINING COMPLETE after " in done.stdout and "epoch 2/2 " in done.stdout


@pytest.mark.slow
def test_the_classification_example_trains_compiled(tmp_path):
    config = "--config=examples/classification/configs/classification_v0.py"
    args = [*SMOKE, "--override=compile=True", f"--override=save_dir={str(tmp_path)!r}"]
    done = _cli("train", config, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRAINING COMPLETE after " in done.stdout and "epoch 1/1 " in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(4 * HANG_S)  # beyond pyproject's 20 minutes: every example in full
def test_every_example_full_run_passes_its_own_checks():
    """``make examples``: each example trains in full, then its scripts/ checks must pass."""
    done = subprocess.run(
        [sys.executable, "scripts/run_examples.py", "--jobs", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3 * HANG_S,  # every example, one after another two at a time
    )
    summary = done.stdout[done.stdout.rfind("example            result") :]
    assert done.returncode == 0, summary or done.stdout[-3000:] + done.stderr[-3000:]
    assert "13 passed, 0 failed" in summary


def _code_lines(path) -> int:
    """Lines that are not blank, a comment or a docstring."""
    text = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            if isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    layout = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in (*layout, tokenize.ENDMARKER):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


# The recipes of a model as a library returns it, and the most lines of code each may take.
RECIPES = {"causal_lm": 60, "resnet_digits": 50}


@pytest.mark.parametrize("example", RECIPES)
def test_a_recipe_config_copied_to_v1_is_a_run_of_its_own(tmp_path, capsys, example):
    """Named after its file, as first-task recommends: the copy is a new run, in its own
    directory, and never meets the original's."""
    original = ROOT / "examples" / example / "configs" / f"{example}_v0.py"
    copy = tmp_path / f"{example}_v1.py"
    copy.write_text(original.read_text())
    saved = {}
    for path in (original, copy):
        capsys.readouterr()
        assert main(["config", f"--config={path}", "--all"]) == 0
        shown = capsys.readouterr().out
        saved[path.stem] = re.search(r"^save_dir: (.+)$", shown, re.M)[1]
        assert f"\nname: {path.stem}\n" in shown
    assert saved[f"{example}_v1"] != saved[f"{example}_v0"]
    assert saved[f"{example}_v1"].endswith(f"checkpoints/{example}_v1")


@pytest.mark.parametrize("example, most", RECIPES.items())
def test_a_recipe_is_as_short_as_its_readme_says(example, most):
    """The task's own files (not base_utils.py, which init writes, nor the checks) hold the
    number of lines of code the README's table gives, and no more than the goal."""
    folder = ROOT / "examples" / example
    files = [
        path
        for sub in ("configs", "dataloaders", "models", "trainer")
        for path in sorted((folder / sub).glob("*.py"))
        if path.name not in ("__init__.py", "base_utils.py")
    ]
    counted = {path.relative_to(folder).as_posix(): _code_lines(path) for path in files}
    readme = (folder / "README.md").read_text()
    for name, lines in counted.items():
        assert re.search(rf"\| `{re.escape(name)}` \|.*\| {lines} \|", readme), (name, lines)
    total = sum(counted.values())
    assert f"| | **the task** | **{total}** |" in readme
    assert total <= most
