"""``gatle-ignite init`` and the project template (CONTRACT 11), from a checkout and a wheel."""

import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gatle_ignite.cli.init import init_project
from gatle_ignite.cli.main import main
from gatle_ignite.dispatch import ConfigError, import_module_from_path
from tests.conftest import HANG_S

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = ROOT / "examples" / "synthetic"
TEMPLATE = ROOT / "src" / "gatle_ignite" / "_template"
NAME = "demo_proj"


def package_files(name):
    """The files of the project's package ``name``, relative to the package."""
    return {
        "__init__.py",
        "configs/base_utils.py",
        f"configs/{name}_v0.py",
        f"configs/{name}_sweep.py",
        "dataloaders/synthetic_dataset.py",
        "losses/loss_functions/cross_entropy.py",
        "metrics/accuracy.py",
        "models/mlp.py",
        f"trainer/{name}_trainer.py",
    }


def expected_files(name):
    """The files a project ``name`` has, relative to its root: every component in one package
    named after it (docs/changes.md: the 0.4 layout of CONTRACT 11.2 had them at the top)."""
    return {"README.md", ".gitignore", *(f"{name}/{f}" for f in package_files(name))}


def files_under(root):
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def clean_env():
    """The environment without PYTHONPATH: the CLI alone must make the project importable."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def cli_command(bin_dir=None):
    """The console script when installed beside the interpreter, else ``python -m``."""
    script = Path(bin_dir or Path(sys.executable).parent) / "gatle-ignite"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gatle_ignite"]


def run(command, cwd):
    return subprocess.run(
        command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=HANG_S
    )


@pytest.fixture
def project(tmp_path, capsys):
    """A freshly generated project ``demo_proj`` under ``tmp_path``."""
    assert init_project(NAME, str(tmp_path)) == 0
    capsys.readouterr()
    return tmp_path / NAME


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("name", ["9lives", "my-project", "class"])
def test_unusable_names_are_refused(name, tmp_path):
    with pytest.raises(ConfigError, match="is not a usable project name") as info:
        init_project(name, str(tmp_path))
    # The name reaches Python as the package every dotted path starts with.
    assert f"'{name}.trainer.{name}_trainer'" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_the_framework_name_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="shadow the framework"):
        init_project("gatle_ignite", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_an_importable_name_is_refused_with_its_origin(tmp_path):
    origin = importlib.util.find_spec("json").origin
    with pytest.raises(ConfigError, match="already importable") as info:
        init_project("json", str(tmp_path))
    assert origin in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_through_the_cli_exits_2_on_stderr(tmp_path, capsys):
    assert main(["init", "my-project", "--dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "config error: " in captured.err
    assert "not a usable project name" in captured.err
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_existing_files_are_refused_and_left_untouched(tmp_path):
    root = tmp_path / NAME
    models = root / NAME / "models"
    models.mkdir(parents=True)
    (models / "mlp.py").write_text("mine\n")
    (root / "README.md").write_text("my readme\n")
    with pytest.raises(ConfigError, match="already exist") as info:
        init_project(NAME, str(tmp_path))
    message = str(info.value)
    assert str(models / "mlp.py") in message
    assert str(root / "README.md") in message
    assert "--force" in message
    assert (models / "mlp.py").read_text() == "mine\n"
    assert (root / "README.md").read_text() == "my readme\n"
    assert files_under(root) == {f"{NAME}/models/mlp.py", "README.md"}


def test_force_overwrites_but_never_deletes(project, tmp_path, capsys):
    models = project / NAME / "models"
    (models / "mlp.py").write_text("edited\n")
    (models / "extra.py").write_text("kept\n")
    assert init_project(NAME, str(tmp_path), force=True) == 0
    assert (models / "mlp.py").read_text() == (SYNTHETIC / "models" / "mlp.py").read_text()
    assert (models / "extra.py").read_text() == "kept\n"
    assert files_under(project) == expected_files(NAME) | {f"{NAME}/models/extra.py"}


def test_force_rerun_through_the_cli_from_the_parent_directory(project, tmp_path):
    # With `python -m` the cwd is on sys.path, so the project is a namespace package there.
    result = run([sys.executable, "-m", "gatle_ignite", "init", NAME, "--force"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"created {project}" in result.stdout
    refused = run([sys.executable, "-m", "gatle_ignite", "init", NAME], cwd=tmp_path)
    assert refused.returncode == 2
    assert "already exist" in refused.stderr


# ----------------------------------------------------------------------------- generated files


def test_generated_files_are_one_package_named_after_the_project(project):
    assert files_under(project) == expected_files(NAME)
    # One regular package: what makes the cwd's copy win over an installed namesake.
    assert list(project.rglob("__init__.py")) == [project / NAME / "__init__.py"]


def test_no_placeholder_or_suffix_survives(project):
    for path in project.rglob("*"):
        assert "{{" not in path.name and "}}" not in path.name, path
        assert not path.name.endswith("-tpl"), path
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            assert "{{" not in text and "-tpl" not in text, path


def test_py_files_are_the_synthetic_examples(project):
    renamed = {
        f"configs/{NAME}_v0.py": "configs/synthetic_v0.py",
        f"configs/{NAME}_sweep.py": "configs/synthetic_sweep.py",
        f"trainer/{NAME}_trainer.py": "trainer/synthetic_trainer.py",
    }
    # The checkpoints go to the project root, above the package, not into it.
    root = (
        "PROJECT_ROOT = Path(__file__).resolve().parent.parent\n",
        f"# The project root, where you run from: this file is <root>/{NAME}/configs/"
        "base_utils.py.\nPROJECT_ROOT = Path(__file__).resolve().parents[2]\n",
    )
    for relative in sorted(package_files(NAME) - {"__init__.py"}):
        source = (SYNTHETIC / renamed.get(relative, relative)).read_text()
        expected = (
            source.replace("examples.synthetic.", f"{NAME}.")
            .replace("synthetic_trainer", f"{NAME}_trainer")
            .replace('"gatle-synthetic"', f'"{NAME}"')
            .replace(*root)
            .replace("synthetic_v0.py", f"{NAME}_v0.py")
        )
        assert (project / NAME / relative).read_text() == expected, relative


def test_config_names_the_project(project):
    text = (project / NAME / "configs" / f"{NAME}_v0.py").read_text()
    assert f'cfg.project_name = "{NAME}"' in text
    assert f'cfg.main_runner = "{NAME}.trainer.{NAME}_trainer"' in text
    assert "examples." not in text


def test_gitignore(project):
    lines = (project / ".gitignore").read_text().split()
    for entry in ("__pycache__/", "*.py[cod]", ".venv/", "checkpoints/", "wandb/", "data/"):
        assert entry in lines


def test_readme_names_every_directory_and_real_builtins(project):
    text = (project / "README.md").read_text()
    for directory in (
        "models/",
        "models/model_utils/",
        "dataloaders/",
        "dataloaders/data_utils/",
        "augmentation/",
        "losses/loss_functions/",
        "losses/",
        "metrics/",
        "optimizer/",
        "scheduler/",
        "trainer/",
        "callbacks/backends/",
        "scripts/",
        "configs/",
    ):
        assert f"`{directory}`" in text, directory
    assert f"gatle-ignite config --config={NAME}/configs/{NAME}_v0.py" in text
    assert f"gatle-ignite train --config={NAME}/configs/{NAME}_v0.py" in text
    assert f"{NAME}/configs/{NAME}_v1.py" in text
    assert f"{NAME}/configs/base_utils.py" in text
    assert "`docs/getting-started.md`" in text
    entrypoints = {
        "losses": "Loss",
        "metrics": "get_metric",
        "optimizers": "get_optimizer",
        "schedulers": "get_scheduler",
        "callbacks.backends": "Backend",
    }
    named = re.findall(
        r"gatle_ignite\.(losses|metrics|optimizers|schedulers|callbacks\.backends)\.(\w+)", text
    )
    assert len(named) >= 24
    for group, module in named:
        loaded = importlib.import_module(f"gatle_ignite.{group}.{module}")
        assert hasattr(loaded, entrypoints[group]), f"gatle_ignite.{group}.{module}"


def test_report_lists_the_files_and_next_steps(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert init_project(NAME) == 0
    out = capsys.readouterr().out
    root = tmp_path / NAME
    assert out.startswith(f"created {root}\n\n")
    listed = [line.strip() for line in out.splitlines() if line.startswith(f"  {NAME}/")]
    assert listed == sorted(f"{NAME}/{relative}" for relative in expected_files(NAME))
    assert f"cd {NAME}" in out
    assert f"gatle-ignite config --config={NAME}/configs/{NAME}_v0.py" in out
    assert f"gatle-ignite train --config={NAME}/configs/{NAME}_v0.py" in out
    assert "README.md" in out.split("next steps")[-1]


def test_init_does_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from gatle_ignite.cli.main import main\n"
        f"assert main(['init', 'light', '--dir', {str(tmp_path)!r}]) == 0\n"
        "heavy = ('torch', 'ignite', 'ml_collections', 'numpy')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    result = run([sys.executable, "-c", code], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_template_ships_no_python_modules():
    shipped = {p.name for p in TEMPLATE.rglob("*") if p.is_file()}
    assert shipped and all(name.endswith("-tpl") for name in shipped)


# ----------------------------------------------------------------------------- the project runs


def test_generated_project_passes_config_and_trains(project):
    config = f"--config={NAME}/configs/{NAME}_v0.py"
    checked = run([*cli_command(), "config", config], cwd=project)
    assert checked.returncode == 0, checked.stderr
    assert "all dotted paths resolve" in checked.stdout
    trained = run([*cli_command(), "train", config, "--override", "max_epochs=1"], cwd=project)
    assert trained.returncode == 0, trained.stderr
    assert "TRAINING COMPLETE after " in trained.stdout
    assert list((project / "checkpoints" / f"{NAME}_v0").glob("latest_epoch_checkpoint_*.pt"))


@pytest.mark.slow
def test_generated_projects_sweep_file_runs_a_sweep(project):
    pytest.importorskip("optuna", reason="the sweep extra is not installed")
    # This checkout's package, whichever one the environment's console script runs.
    sweep = [
        sys.executable,
        "-m",
        "gatle_ignite",
        "sweep",
        f"--sweep={NAME}/configs/{NAME}_sweep.py",
    ]
    done = subprocess.run(
        [*sweep, "--trials=2", "--override=max_epochs=1"],
        cwd=project,
        env={**clean_env(), "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "SWEEP COMPLETE: 2 trials finished" in done.stdout
    # The baseline the file asks for first is trial 0.
    assert "trial 0 started: optimizer_params.lr=0.001, model_params.hidden=128" in done.stdout
    assert (project / "checkpoints" / f"{NAME}_sweep" / "trial_0001" / "run.json").exists()


# ----------------------------------------------------------------------------- from a wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from this checkout, by pip and the project's own build backend."""
    out = tmp_path_factory.mktemp("wheel")
    # With hatchling at hand no download is needed; otherwise pip fetches it to build.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q"]
    subprocess.run(
        [*command, "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=HANG_S
    )
    (path,) = out.glob("gatle_ignite-*.whl")
    return path


def test_wheel_ships_the_template(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        "gatle_ignite/_template/" + p.relative_to(TEMPLATE).as_posix()
        for p in TEMPLATE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert len(shipped) == 11
    assert shipped <= names
    assert "gatle_ignite/cli/init.py" in names


def dependency_dirs():
    """Where this interpreter finds the runtime dependencies, without the checkout's source."""
    dirs = set()
    for module in ("torch", "ignite", "ml_collections", "numpy", "tqdm", "yaml", "absl"):
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin:
            dirs.add(str(Path(spec.origin).resolve().parents[1]))
    assert str(ROOT / "src") not in dirs
    return sorted(dirs)


def _installed_wheel(wheel, tmp_path):
    """A fresh venv holding the wheel, with the dependencies visible; returns its bin dir."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=HANG_S)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)]
    subprocess.run(pip, check=True, timeout=HANG_S)
    purelib = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=tmp_path,
    ).stdout.strip()
    # Plain directory lines: a .pth line only extends sys.path, so .pth files inside those
    # directories (the checkout's editable install among them) are not processed.
    Path(purelib, "zz_dependencies.pth").write_text("\n".join(dependency_dirs()) + "\n")
    where = run([str(python), "-c", "import gatle_ignite; print(gatle_ignite.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr
    installed = Path(where.stdout.strip()).resolve()
    assert installed.is_relative_to(venv.resolve()), installed
    assert not installed.is_relative_to(ROOT)
    return bin_dir


@pytest.mark.slow
def test_installed_wheel_inits_and_trains_outside_the_checkout(wheel, tmp_path):
    bin_dir = _installed_wheel(wheel, tmp_path)
    work = tmp_path / "outside"
    work.mkdir()
    cli = cli_command(bin_dir)
    assert cli[0] == str(bin_dir / "gatle-ignite")
    created = run([*cli, "init", NAME], cwd=work)
    assert created.returncode == 0, created.stderr
    project = work / NAME
    assert files_under(project) == expected_files(NAME)
    config = f"--config={NAME}/configs/{NAME}_v0.py"
    checked = run([*cli, "config", config], cwd=project)
    assert "all dotted paths resolve" in checked.stdout, checked.stderr
    trained = run([*cli, "train", config, "--override", "max_epochs=1"], cwd=project)
    assert trained.returncode == 0, trained.stderr
    assert "TRAINING COMPLETE after " in trained.stdout


@pytest.mark.slow
def test_installed_wheel_trains_a_copy_of_the_synthetic_example(wheel, tmp_path):
    bin_dir = _installed_wheel(wheel, tmp_path)
    work = tmp_path / "outside"
    shutil.copytree(
        ROOT / "examples",
        work / "examples",
        ignore=shutil.ignore_patterns("checkpoints*", "__pycache__"),
    )
    config = "--config=examples/synthetic/configs/synthetic_v0.py"
    trained = run([*cli_command(bin_dir), "train", config, "--override", "max_epochs=2"], work)
    assert trained.returncode == 0, trained.stderr
    assert "TRAINING COMPLETE after " in trained.stdout and "epoch 2/2 " in trained.stdout
    assert (
        work / "examples/synthetic/checkpoints/synthetic_v0/latest_epoch_checkpoint_2.pt"
    ).exists()


# ----------------------------------------------------------------------------- shadowing


def _installed_namesakes(tmp_path):
    """A site directory holding packages named like the 0.4 layout's folders, as PyPI's
    ``models``, ``metrics`` and ``trainer`` would be once installed."""
    site = tmp_path / "site"
    for name in ("models", "metrics", "trainer", "configs", "losses", "dataloaders"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f'"""Not the project\'s {name}."""\n')
    return site


def test_an_installed_namesake_cannot_shadow_the_generated_project(project, tmp_path):
    env = {**clean_env(), "PYTHONPATH": str(_installed_namesakes(tmp_path))}
    config = f"--config={NAME}/configs/{NAME}_v0.py"
    checked = subprocess.run(
        [*cli_command(), "config", config], cwd=project, env=env, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    assert "all dotted paths resolve" in checked.stdout


def test_a_shadowed_0_4_folder_is_named_in_the_import_error(tmp_path, monkeypatch):
    # The 0.4 layout: a top-level models/ folder, no __init__.py, beside an installed `models`.
    project = tmp_path / "old_layout"
    (project / "models").mkdir(parents=True)
    (project / "models" / "mlp.py").write_text("Model = object\n")
    site = _installed_namesakes(tmp_path)
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(sys.modules, "models", raising=False)
    with pytest.raises(ConfigError) as info:
        import_module_from_path("models.mlp", field="model_name")
    message = str(info.value)
    installed = site / "models" / "__init__.py"
    assert f"'models' resolves to {installed}, an installed package" in message
    assert f"not this project's folder {project / 'models'}" in message
    assert "run from the project root" not in message
    # The control: without the namesake the folder imports, and nothing is said.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    monkeypatch.delitem(sys.modules, "models", raising=False)
    assert import_module_from_path("models.mlp").Model is object


def test_a_config_importing_a_shadowed_folder_is_told_so(tmp_path, monkeypatch):
    from gatle_ignite.config.loader import load_config_from_file

    project = tmp_path / "old_layout"
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "base_utils.py").write_text("ROOT = '.'\n")
    config = project / "configs" / "old_v0.py"
    config.write_text("from configs.base_utils import ROOT\n\n\ndef get_config():\n    pass\n")
    site = _installed_namesakes(tmp_path)
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(sys.modules, "configs", raising=False)
    with pytest.raises(ConfigError, match="'configs' resolves to .*an installed package") as info:
        load_config_from_file(config)
    assert "Run from the directory" not in str(info.value)
