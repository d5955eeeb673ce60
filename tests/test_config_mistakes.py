"""Config mistakes caught before the first epoch: misspelt fields in a config file, unknown
``--override`` keys with a "did you mean", and overrides that add keys to params mappings."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_fixtures import trainer as fixture_trainer
from cli_fixtures.configs import COMPONENTS, make_config, write_config

from gatle_ignite.cli import launch
from gatle_ignite.cli.init import init_project
from gatle_ignite.cli.main import main
from gatle_ignite.config.validate import validate_config
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.specs import EngineSpec
from tests.conftest import HANG_S, ROOT
from tests.test_examples import CONFIGS as EXAMPLE_CONFIGS
from tests.toy.trainer import Trainer as ToyTrainer

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    # syspath_prepend also restores sys.path, which the CLI extends with the working directory.
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fixture_trainer, "CALLS", [])


def _config_error(capsys, argv) -> str:
    """Run the CLI on ``argv``, expect a config error, and return what it printed on stderr."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("\nconfig error: ")
    assert "Traceback" not in captured.err + captured.out
    return captured.err


# ----------------------------------------------------------------------------- misspelt fields


MISSPELT = [
    ("max_epoch", 3, "max_epochs"),
    ("optimiser_params", {"lr": 0.1}, "optimizer_params"),
    ("score_nme", "valid/acc", "score_name"),
    ("early_stopping_patience", 3, "early_stop_patience"),
    ("lr_schedular", COMPONENTS, "lr_scheduler"),
]


@pytest.mark.parametrize("command", ["config", "train", "eval"])
@pytest.mark.parametrize(("name", "value", "meant"), MISSPELT)
def test_a_misspelt_field_is_a_config_error_naming_the_field_meant(
    tmp_path, capsys, command, name, value, meant
):
    path = write_config(tmp_path, **{name: value})
    err = _config_error(capsys, [command, f"--config={path}"])
    assert f"'{name}': did you mean '{meant}'?" in err
    assert "rename it" in err
    assert fixture_trainer.CALLS == []


def test_every_misspelt_field_is_listed_at_once(tmp_path, capsys):
    path = write_config(tmp_path, max_epoch=3, score_nme="valid/acc")
    err = _config_error(capsys, ["config", f"--config={path}"])
    assert "2 config field(s)" in err
    assert "'max_epochs'" in err and "'score_name'" in err


def test_a_misspelling_is_reported_before_the_required_field_it_leaves_unset(tmp_path, capsys):
    path = write_config(tmp_path, optimizer_name=None, optimiser_name=COMPONENTS)
    err = _config_error(capsys, ["config", f"--config={path}"])
    assert "'optimiser_name': did you mean 'optimizer_name'?" in err


OWN_FIELDS = {
    "teacher_weights": "ckpt/teacher.pt",
    "ema_decay": 0.999,
    "vocab_size": 1000,
    "my_data_root": "/data",
    "knn_params": {"k": 20},
    "diffusion": {"steps": 50},
    "seeds": [1, 2, 3],
    "speed": 2,
    "epochs_per_stage": 2,
    "teacher_model_name": COMPONENTS,
    "teacher_model_params": {},
    # The fields of engines declared with EngineSpec.for_split(name), for any name.
    "every_probe": 2,
    "probe_score_name": "probe/acc",
    "probe_score_factor": 1,
    "probe_ds_name": COMPONENTS,
    "probe_ds_params": {"bs": 8},
    "probe_metrics": {},
    "probe_length": 4,
    "probe_early_stop_patience": 2,
    "probe_early_stop_after": 1,
    "every_raw": 1,
    "raw_metrics": {},
    "bank_ds_name": COMPONENTS,
    "bank_ds_params": {"bs": 8},
    # Read by the discord backend, though base_config() does not declare it.
    "discord_username": "bot",
}


def test_fields_of_ones_own_and_of_declared_engines_pass(tmp_path, capsys):
    path = write_config(tmp_path, **OWN_FIELDS)
    assert main(["config", f"--config={path}"]) == 0
    assert "all dotted paths resolve." in capsys.readouterr().out


def test_a_field_of_ones_own_trains(tmp_path):
    path = write_config(tmp_path, ema_decay=0.999, every_probe=0)
    assert main(["train", f"--config={path}"]) == 0
    [(call, _rank, cfg)] = fixture_trainer.CALLS
    assert call == "fit" and cfg.ema_decay == 0.999


def test_the_fields_a_declared_engine_names_are_the_frameworks():
    # An engine may name any field; a trainer declaring it makes that field a known one.
    spec = EngineSpec(key="knn", engine_type="knn", metrics_field="val_metric")
    cfg = make_config(val_metric={})
    validate_config(cfg, specs=(spec,))
    with pytest.raises(ConfigError, match="'val_metric': did you mean 'val_metrics'"):
        validate_config(cfg)


def test_the_trainer_refuses_a_misspelt_field_when_it_is_built(make_cfg):
    cfg = make_cfg(max_epoch=3)
    with pytest.raises(ConfigError, match="did you mean 'max_epochs'"):
        ToyTrainer(0, cfg)


def test_the_project_template_passes(tmp_path, capsys, monkeypatch):
    init_project("typo_check", str(tmp_path))
    monkeypatch.chdir(tmp_path / "typo_check")
    assert main(["config", "--config=typo_check/configs/typo_check_v0.py"]) == 0
    assert "all dotted paths resolve." in capsys.readouterr().out


def test_every_shipped_example_config_passes(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    assert main(["config", f"--config={','.join(EXAMPLE_CONFIGS)}"]) == 0
    assert capsys.readouterr().out.count("all dotted paths resolve.") == len(EXAMPLE_CONFIGS)


def test_a_real_process_exits_2_without_a_traceback(tmp_path):
    path = write_config(tmp_path, max_epoch=3)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={path}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 2
    assert "config error: " in done.stderr and "did you mean 'max_epochs'?" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("body", "returned"), [("cfg = None", "None"), ("return {'max_epochs': 3}", "a dict")]
)
@pytest.mark.parametrize("command", ["config", "train"])
def test_a_get_config_returning_no_configdict_is_a_config_error(
    tmp_path, capsys, command, body, returned
):
    path = tmp_path / "cfg.py"
    path.write_text(f"def get_config():\n    {body}\n")
    err = _config_error(capsys, [command, f"--config={path}"])
    assert f"get_config() in {path} returned {returned}, not a ConfigDict" in err
    assert "return cfg" in err


# ----------------------------------------------------------------------------- unknown overrides


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("max_epoch=3", "did you mean 'max_epochs'?"),
        ("score_nam=valid/acc", "did you mean 'score_name'?"),
        ("lr=1e-4", "did you mean 'optimizer_params.lr'?"),
        ("ema_decai=0.9", "did you mean 'ema_decay'?"),
        ("val_metrics.acc.cls_nme=x", "did you mean 'cls_name'?"),
        ("val_metrics.accc.params.k=1", "did you mean 'val_metrics.acc'?"),
    ],
)
def test_an_unknown_override_key_says_what_it_may_mean(tmp_path, capsys, override, hint):
    path = write_config(
        tmp_path,
        ema_decay=0.99,
        optimizer_params={"lr": 0.1},
        val_metrics={"acc": {"cls_name": COMPONENTS, "params": {}}},
    )
    err = _config_error(capsys, ["train", f"--config={path}", f"--override={override}"])
    assert hint in err
    assert fixture_trainer.CALLS == []


def test_no_hint_when_nothing_is_close(tmp_path, capsys):
    path = write_config(tmp_path)
    err = _config_error(capsys, ["config", f"--config={path}", "--override=zzz=1"])
    assert "cannot override unknown config field 'zzz'" in err and "did you mean" not in err


# ----------------------------------------------------------------------------- params mappings


@pytest.mark.parametrize(
    ("fields", "override", "path", "expected"),
    [
        ({}, "optimizer_params.betas=(0.9, 0.95)", ("optimizer_params", "betas"), (0.9, 0.95)),
        ({}, "model_params.depth=4", ("model_params", "depth"), 4),
        ({"model_params": {"width": 8}}, "model_params.depth=4", ("model_params", "depth"), 4),
        ({}, "criterion_params.reduction=sum", ("criterion_params", "reduction"), "sum"),
        ({}, "lr_scheduler_params.warmup=2", ("lr_scheduler_params", "warmup"), 2),
        ({}, "aug_params.flip=True", ("aug_params", "flip"), True),
        ({}, "compile_params.mode=max-autotune", ("compile_params", "mode"), "max-autotune"),
        ({}, "auto_model_params.broadcast_buffers=False", ("auto_model_params",), None),
        ({}, "train_ds_params.crop=32", ("train_ds_params", "crop"), 32),
        ({"valid_ds_params": {"bs": 4}}, "valid_ds_params.crop=32", ("valid_ds_params",), None),
        ({"probe_ds_params": {}}, "probe_ds_params.k=3", ("probe_ds_params", "k"), 3),
        (
            {"val_metrics": {"acc": {"cls_name": COMPONENTS, "params": {}}}},
            "val_metrics.acc.params.top_k=5",
            ("val_metrics", "acc", "params", "top_k"),
            5,
        ),
        (
            {"val_metrics": {"acc": {"cls_name": COMPONENTS}}},
            "val_metrics.acc.params.top_k=5",
            ("val_metrics", "acc", "params", "top_k"),
            5,
        ),
        # A metric entry's params given whole, where it has none and where it has some.
        (
            {"val_metrics": {"acc": {"cls_name": COMPONENTS}}},
            "val_metrics.acc.params={'src_name': 'logit'}",
            ("val_metrics", "acc", "params", "src_name"),
            "logit",
        ),
        (
            {"val_metrics": {"acc": {"cls_name": COMPONENTS, "params": {"top_k": 2}}}},
            "val_metrics.acc.params={'src_name': 'logit'}",
            ("val_metrics", "acc", "params"),
            {"src_name": "logit"},
        ),
        (
            {"criterion_params": {"dict_of_loss_params": {"ce": {"loss_params": {}}}}},
            "criterion_params.dict_of_loss_params.ce.loss_params.label_smoothing=0.1",
            ("criterion_params", "dict_of_loss_params", "ce", "loss_params", "label_smoothing"),
            0.1,
        ),
    ],
)
def test_an_override_adds_a_key_inside_a_params_mapping(tmp_path, fields, override, path, expected):
    config = write_config(tmp_path, **fields)
    assert main(["train", f"--config={config}", f"--override={override}"]) == 0
    [(_call, _rank, cfg)] = fixture_trainer.CALLS
    value = cfg
    for part in path:
        value = value[part]
    if expected is not None:
        assert (value.to_dict() if hasattr(value, "to_dict") else value) == expected
    else:
        assert override.split("=")[0].split(".")[-1] in value


def test_a_locked_config_takes_new_params_keys_and_stays_locked(tmp_path):
    config = tmp_path / "locked.py"
    config.write_text(
        "from cli_fixtures.configs import make_config\n\n\n"
        "def get_config():\n"
        "    cfg = make_config(save_dir=" + repr(str(tmp_path / "run")) + ")\n"
        "    cfg.lock()\n"
        "    return cfg\n"
    )
    assert main(["train", f"--config={config}", "--override=optimizer_params.eps=1e-6"]) == 0
    [(_call, _rank, cfg)] = fixture_trainer.CALLS
    assert cfg.optimizer_params.eps == 1e-6
    assert cfg.is_locked and cfg.optimizer_params.is_locked


@pytest.mark.parametrize(
    ("override", "phrase"),
    [
        # Top-level fields and groups that are no params mapping stay closed.
        ("ema_decay=0.9", "cannot override unknown config field 'ema_decay'"),
        ("val_metrics.f1.cls_name=x", "unknown config field 'val_metrics.f1'"),
        ("val_metrics.acc.weight=2", "'val_metrics.acc' has no 'weight'"),
        ("knn_params.k=3", "'knn_params' has no 'k'"),
        # Inside a params mapping a typo of a key it holds adds nothing either.
        ("optimizer_params.weight_decy=0.1", "misspelling of 'optimizer_params.weight_decay'"),
        # Only the last part is added; a new group is given whole.
        ("model_params.encoder.depth=2", "unknown config field 'model_params.encoder'"),
        ("model_params.2x=1", "not a Python identifier"),
        ("model_params..x=1", "has an empty part"),
        # A metric's params given whole is a mapping.
        ("val_metrics.loss.params=3", "a metric's params is a mapping of its keyword arguments"),
    ],
)
def test_keys_outside_params_mappings_stay_refused(tmp_path, capsys, override, phrase):
    path = write_config(
        tmp_path,
        knn_params={"n": 1},
        optimizer_params={"lr": 0.1, "weight_decay": 0.0},
        val_metrics={
            "acc": {"cls_name": COMPONENTS, "params": {}},
            "loss": {"cls_name": COMPONENTS},
        },
    )
    err = _config_error(capsys, ["config", f"--config={path}", f"--override={override}"])
    assert phrase in err


@pytest.mark.parametrize(
    "override",
    [
        "model_params.__class__=1",
        "train_ds_params.__init__=1",
        "val_metrics.acc.params.__dict__=1",
        "model_params={'__class__': 1}",
        "model_params.encoder={'inner': {'__init__': 2}}",
    ],
)
def test_a_special_name_in_an_override_is_a_config_error(tmp_path, capsys, override):
    path = write_config(tmp_path, val_metrics={"acc": {"cls_name": COMPONENTS, "params": {}}})
    err = _config_error(capsys, ["train", f"--config={path}", f"--override={override}"])
    assert "is a Python special name, not a keyword argument a component takes" in err
    assert fixture_trainer.CALLS == []


def test_a_whole_new_group_is_given_as_a_dict(tmp_path):
    path = write_config(tmp_path)
    override = "--override=model_params.encoder={'depth': 2, 'width': 8}"
    assert main(["train", f"--config={path}", override]) == 0
    [(_call, _rank, cfg)] = fixture_trainer.CALLS
    assert cfg.model_params.encoder.to_dict() == {"depth": 2, "width": 8}


# ----------------------------------------------------------------------------- reaching the objects


@pytest.fixture
def trained_tasks(monkeypatch):
    """The toy tasks ``launch`` trains, kept for inspection."""
    tasks = []
    run_task = launch.run_task

    def keep(local_rank, cfg):
        tasks.append(run_task(local_rank, cfg))
        return tasks[-1]

    monkeypatch.setattr(launch, "run_task", keep)
    return tasks


def _toy_config_file(tmp_path, *lines) -> Path:
    path = tmp_path / "toy_run.py"
    body = "\n".join(f"    {line}" for line in lines)
    path.write_text(
        "from tests.toy.config import toy_config\n\n\n"
        "def get_config():\n"
        f"    cfg = toy_config(save_dir={str(tmp_path / 'run')!r}, max_epochs=1, "
        "train_length=2, val_length=1)\n"
        f"{body}\n"
        "    return cfg\n"
    )
    return path


@pytest.mark.parametrize(
    "lines",
    [[], ["cfg.optimizer_params = {}"], ["cfg.lock()"]],
    ids=["params-holding-keys", "empty-params", "locked-config"],
)
def test_added_optimizer_betas_reach_adamw(tmp_path, monkeypatch, trained_tasks, lines):
    monkeypatch.syspath_prepend(str(ROOT))
    path = _toy_config_file(tmp_path, *lines)
    override = "--override=optimizer_params.betas=(0.9, 0.95)"
    assert main(["train", f"--config={path}", override]) == 0
    [task] = trained_tasks
    assert task.optimizer.param_groups[0]["betas"] == (0.9, 0.95)


def test_an_added_model_param_reaches_the_model(tmp_path, monkeypatch, trained_tasks):
    monkeypatch.syspath_prepend(str(ROOT))
    path = _toy_config_file(tmp_path)
    assert main(["train", f"--config={path}", "--override=model_params.dropout=0.25"]) == 0
    [task] = trained_tasks
    assert task.model.net[2].p == 0.25


def test_a_builtin_named_without_its_package_gets_its_full_path(tmp_path, capsys):
    path = write_config(tmp_path)
    argv = ["config", f"--config={path}", "--override=optimizer_name=adamw"]
    err = _config_error(capsys, argv)
    assert "could not import 'adamw'" in err and "'gatle_ignite.optimizers.adamw'" in err
    # A name the package does not have keeps the import advice.
    err = _config_error(capsys, ["config", f"--config={path}", "--override=optimizer_name=nadam9"])
    assert "gatle-ignite's own" not in err and "PYTHONPATH" in err


def test_train_names_a_bad_dotted_path_before_anything_else(tmp_path, capsys):
    path = write_config(tmp_path)
    argv = ["train", f"--config={path}", "--override=model_name=nowhere.model"]
    err = _config_error(capsys, argv)
    assert "do not resolve" in err and "nowhere.model" in err
    assert fixture_trainer.CALLS == [] and not (tmp_path / "cfg_run").exists()


def test_an_import_failing_inside_a_library_shows_its_underlying_error(tmp_path, capsys):
    # A library importing lazily, as transformers does, when torchvision does not match torch.
    (tmp_path / "lazylib").mkdir()
    (tmp_path / "lazylib" / "__init__.py").write_text(
        "try:\n"
        "    raise RuntimeError('operator torchvision::nms does not exist\\nmore detail')\n"
        "except RuntimeError as e:\n"
        "    raise ModuleNotFoundError(\n"
        "        \"Could not import module 'GPT2LMHeadModel'. Are this object's requirements "
        'defined correctly?"\n'
        "    ) from e\n"
    )
    (tmp_path / "lm_model.py").write_text("import lazylib\n\nModel = None\n")
    path = write_config(tmp_path)
    argv = ["config", f"--config={path}", "--override=model_name=lm_model"]
    err = _config_error(capsys, argv)
    assert (
        "could not import 'lm_model' (from config field 'model_name'): Could not import module "
        "'GPT2LMHeadModel'. Are this object's requirements defined correctly?\n"
        "  Underlying error: RuntimeError: operator torchvision::nms does not exist\n" in err
    )
    assert "more detail" not in err
