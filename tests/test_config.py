"""Config loading, overrides, validation and the dotted-path pre-flight (CONTRACT 3.4-3.7)."""

import re
import sys
import warnings
from pathlib import Path

import pytest
from cli_fixtures.configs import COMPONENTS, make_config, write_config

from gatle_ignite import base_config, dispatch
from gatle_ignite.config.base import REQUIRED_FIELDS
from gatle_ignite.config.loader import apply_overrides, load_config_from_file
from gatle_ignite.config.validate import check_dispatch, validate_config
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.trainer.specs import EngineSpec

TESTS_DIR = Path(__file__).resolve().parent
MISSING = "cli_fixtures.does_not_exist"


@pytest.fixture(autouse=True)
def fixtures_importable(monkeypatch):
    # Also restores sys.path afterwards.
    monkeypatch.syspath_prepend(str(TESTS_DIR))


@pytest.fixture
def strict_warnings():
    """Turn any warning into an error, to prove that none is raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def _warnings_from(cfg, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate_config(cfg, **kwargs)
    return caught


# ----------------------------------------------------------------------------- loading


def test_load_returns_get_config_result_without_registering_a_module(tmp_path):
    path = write_config(tmp_path, max_epochs=4)
    cfg = load_config_from_file(path)
    assert cfg.max_epochs == 4 and cfg.name == "good"
    assert "gatle_config_module" not in sys.modules
    assert load_config_from_file(str(path)).max_epochs == 4


def test_load_does_not_type_check_the_return_value(tmp_path):
    path = tmp_path / "odd.py"
    path.write_text("def get_config():\n    return 42\n")
    assert load_config_from_file(path) == 42


def test_missing_file(tmp_path):
    path = tmp_path / "nope.py"
    with pytest.raises(ConfigError, match="config file not found: .*nope.py"):
        load_config_from_file(path)


def test_file_that_is_not_a_python_module(tmp_path):
    path = tmp_path / "cfg.txt"
    path.write_text("def get_config():\n    return 1\n")
    with pytest.raises(ConfigError, match="could not load a python module from: .*cfg.txt"):
        load_config_from_file(path)


def test_relative_import_is_explained(tmp_path):
    path = tmp_path / "rel.py"
    path.write_text("from .vocab import X\n\n\ndef get_config():\n    return X\n")
    with pytest.raises(ConfigError, match="relative import") as info:
        load_config_from_file(path)
    assert "absolute imports" in str(info.value)
    assert "from dataloaders.vocab import X" in str(info.value)


def test_import_error_inside_config(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import no_such_package_xyz\n\n\ndef get_config():\n    return 1\n")
    with pytest.raises(ConfigError, match="could not import .*broken.py") as info:
        load_config_from_file(path)
    assert "no_such_package_xyz" in str(info.value)
    assert "absolute imports" in str(info.value)


def test_other_exceptions_propagate_unchanged(tmp_path):
    path = tmp_path / "boom.py"
    path.write_text("1 / 0\n")
    with pytest.raises(ZeroDivisionError):
        load_config_from_file(path)


def test_config_without_get_config(tmp_path):
    path = tmp_path / "empty.py"
    path.write_text("X = 1\n")
    with pytest.raises(ConfigError, match=r"config file .*empty.py must define get_config\(\)"):
        load_config_from_file(path)


# ----------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    "item, key, expected",
    [
        ("max_epochs=7", "max_epochs", 7),
        ("grad_clip_norm=1e-4", "grad_clip_norm", 1e-4),
        ("logger_name=['text', 'pbar']", "logger_name", ["text", "pbar"]),
        ("name=foo", "name", "foo"),
        ("name='quoted'", "name", "quoted"),
        ("score_name=valid/acc", "score_name", "valid/acc"),
        ("name=a=b", "name", "a=b"),
        (" max_epochs =3", "max_epochs", 3),
        ("resume=True", "resume", True),
    ],
)
def test_override_values_are_parsed_as_literals(item, key, expected):
    cfg = apply_overrides(make_config(), [item])
    assert cfg[key] == expected
    assert type(cfg[key]) is type(expected)


def test_nested_override_leaves_siblings_alone():
    cfg = make_config(optimizer_params={"lr": 1.0, "weight_decay": 0.5})
    apply_overrides(cfg, ["optimizer_params.lr=1e-4"])
    assert cfg.optimizer_params.lr == 1e-4
    assert cfg.optimizer_params.weight_decay == 0.5


def test_deeply_nested_override():
    cfg = make_config(train_ds_params={"bs": 4, "sampler_params": {"params": {"k": 1}}})
    apply_overrides(cfg, ["train_ds_params.sampler_params.params.k=2"])
    assert cfg.train_ds_params.sampler_params.params.k == 2


def test_overrides_walk_any_mapping():
    cfg = {"group": {"value": 1}}
    assert apply_overrides(cfg, ["group.value=2"]) == {"group": {"value": 2}}


def test_no_overrides_returns_cfg_unchanged():
    cfg = make_config()
    assert apply_overrides(cfg, None) is cfg
    assert apply_overrides(cfg, []) is cfg


@pytest.mark.parametrize(
    "save_dir, overrides, expected",
    [
        # Named after the run, as ckpt_dir(cfg.name) makes it: the directory follows the name.
        ("runs/good", ["name=good_lr3e-4"], "runs/good_lr3e-4"),
        ("/abs/runs/good/", ["name=other"], "/abs/runs/other"),
        ("good", ["name=other"], "other"),
        # A save_dir given too wins, in either order.
        ("runs/good", ["name=other", "save_dir=mine"], "mine"),
        ("runs/good", ["save_dir=mine", "name=other"], "mine"),
        # Not named after the run: the name alone changes, the directory stays.
        ("runs/shared", ["name=other"], "runs/shared"),
        ("runs/good_v2", ["name=other"], "runs/good_v2"),
        ("runs/good", ["max_epochs=3"], "runs/good"),
    ],
)
def test_a_new_name_moves_a_save_dir_named_after_the_run(save_dir, overrides, expected):
    cfg = apply_overrides(make_config(save_dir=save_dir), overrides)
    assert cfg.save_dir == expected


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="override 'max_epochs' is not of the form key=value"):
        apply_overrides(make_config(), ["max_epochs"])


def test_unknown_nested_leaf_names_it_and_adds_nothing():
    # A metric entry is no params mapping: its keys are the framework's, so none is added.
    cfg = make_config(val_metrics={"acc": {"cls_name": COMPONENTS, "params": {}}})
    with pytest.raises(ConfigError, match="has no 'cls_nme'") as info:
        apply_overrides(cfg, ["val_metrics.acc.cls_nme=1"])
    message = str(info.value)
    assert "val_metrics.acc.cls_nme" in message
    assert "'val_metrics.acc' has no 'cls_nme'" in message
    assert "['cls_name', 'params']" in message
    assert "cls_nme" not in cfg.val_metrics.acc


def test_a_new_key_inside_a_params_mapping_is_added():
    cfg = make_config(optimizer_params={"lr": 1.0, "betas": [0.9, 0.99]})
    apply_overrides(cfg, ["optimizer_params.lr_rate=1"])
    assert cfg.optimizer_params.lr_rate == 1 and cfg.optimizer_params.lr == 1.0


def test_unknown_intermediate_segment():
    cfg = make_config()
    with pytest.raises(ConfigError, match="unknown config field 'optimizer_params.extra'"):
        apply_overrides(cfg, ["optimizer_params.extra.lr=1"])
    with pytest.raises(ConfigError, match="unknown config field 'nope'"):
        apply_overrides(cfg, ["nope.lr=1"])
    assert "extra" not in cfg.optimizer_params and "nope" not in cfg


def test_intermediate_that_is_not_a_mapping():
    with pytest.raises(ConfigError, match="not a group of fields") as info:
        apply_overrides(make_config(), ["max_epochs.foo=1"])
    assert "'max_epochs' is a int" in str(info.value)


def test_unknown_top_level_field_is_refused_not_added():
    cfg = make_config()
    with pytest.raises(ConfigError, match="cannot override unknown config field 'max_epoch'"):
        apply_overrides(cfg, ["max_epoch=5"])
    assert "max_epoch" not in cfg


def test_optional_field_never_set_is_refused():
    cfg = make_config()
    with pytest.raises(ConfigError, match="unknown config field 'valid_ds_name'"):
        apply_overrides(cfg, ["valid_ds_name=data.val"])
    assert "valid_ds_name" not in cfg


def test_optional_field_the_config_set_can_be_overridden():
    cfg = make_config(valid_ds_name="data.val")
    apply_overrides(cfg, ["valid_ds_name=data.other"])
    assert cfg.valid_ds_name == "data.other"


def test_a_type_clash_is_a_config_error_naming_the_field():
    """ml_collections raises TypeError; a user gets the field and the type it holds."""
    with pytest.raises(ConfigError, match=r"(?s)cannot override 'max_epochs' with 'foo'.*\(int\)"):
        apply_overrides(make_config(), ["max_epochs=foo"])


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("max_epochs=0", "max_epochs must be an int >= 1"),
        ("every_val=-1", "every_val must be an int >= 0"),
        ("train_length=0", "train_length must be None"),
        ("grad_clip_norm=-1.0", "grad_clip_norm must be None (off) or a number > 0"),
        ("logger_name=['text', 3]", "logger_name must be a list of non-empty strings"),
        ("train_ds_params.bs=0", "train_ds_params.bs must be an int >= 1"),
        ("train_ds_params.num_workers=-2", "train_ds_params.num_workers must be an int >= 0"),
    ],
)
def test_unusable_values_are_refused_by_field(override, fragment):
    cfg = make_config(train_ds_params={"bs": 8, "num_workers": 0})
    cfg = apply_overrides(cfg, [override])
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        validate_config(cfg)


def test_every_unusable_value_is_listed_at_once():
    cfg = apply_overrides(make_config(), ["max_epochs=0", "log_every=0"])
    with pytest.raises(ConfigError, match="2 config value") as info:
        validate_config(cfg)
    assert "max_epochs" in str(info.value) and "log_every" in str(info.value)


# ----------------------------------------------------------------------------- validate_config


def test_valid_config_passes_and_is_returned(strict_warnings):
    cfg = make_config()
    assert validate_config(cfg) is cfg


def test_all_missing_required_fields_in_one_message():
    with pytest.raises(ConfigError) as info:
        validate_config(base_config())
    message = str(info.value)
    for field in REQUIRED_FIELDS:
        assert repr(field) in message
    assert "base_config()" in message and "get_config()" in message


def test_empty_string_counts_as_missing():
    with pytest.raises(ConfigError) as info:
        validate_config(make_config(name="", optimizer_name=""))
    message = str(info.value)
    assert "'name'" in message and "'optimizer_name'" in message
    assert "'model_name'" not in message


@pytest.mark.parametrize("value", [0, -1, True])
def test_bad_n_saved(value):
    with pytest.raises(ConfigError, match="n_saved must be an int >= 1") as info:
        validate_config(make_config(n_saved=value))
    assert "save_ckpt = False" in str(info.value)


def test_n_saved_string_set_through_ignore_type():
    cfg = make_config()
    with cfg.ignore_type():
        cfg.n_saved = "3"
    with pytest.raises(ConfigError, match="n_saved must be an int >= 1"):
        validate_config(cfg)


@pytest.mark.parametrize("value", [None, 1, 5])
def test_good_n_saved(value):
    validate_config(make_config(n_saved=value))


def test_n_saved_not_checked_without_checkpoints():
    validate_config(make_config(save_ckpt=False, n_saved=0))


@pytest.mark.parametrize("value", ["yes", 1, "AUTO"])
def test_bad_compile_value(value):
    with pytest.raises(ConfigError, match="must be True, False"):
        validate_config(make_config(compile=value))


@pytest.mark.parametrize("value", [None, True, False, "auto"])
def test_good_compile_value(value):
    validate_config(make_config(compile=value))


def _probe_config(**fields):
    cfg = make_config(**fields)
    cfg.probe_ds_name = COMPONENTS
    cfg.probe_score_name = "probe/acc"
    cfg.probe_score_factor = 1
    return cfg


def test_declared_engine_that_is_never_built_warns():
    cfg = _probe_config()
    cfg.every_probe = 0
    caught = _warnings_from(cfg, specs=(EngineSpec.for_split("probe"),))
    messages = [str(w.message) for w in caught]
    assert any("no best-on-probe checkpoint" in m and "every_probe" in m for m in messages)
    assert all(w.category is UserWarning for w in caught)
    # stacklevel=3 points the warning at whoever called validate_config.
    assert caught and all(w.filename == __file__ for w in caught)


def test_declared_engine_that_runs_does_not_warn(strict_warnings):
    cfg = _probe_config()
    cfg.every_probe = 2
    validate_config(cfg, specs=(EngineSpec.for_split("probe"),))


def test_declared_engine_without_data_warns():
    cfg = _probe_config()
    cfg.every_probe = 1
    cfg.probe_ds_name = ""
    messages = [str(w.message) for w in _warnings_from(cfg, specs=(EngineSpec.for_split("probe"),))]
    assert any("probe_ds_name" in m and "no best-on-probe checkpoint" in m for m in messages)


def test_evaluator_score_without_validation_data_warns():
    messages = [str(w.message) for w in _warnings_from(make_config(score_name="valid/acc"))]
    assert any("valid_ds_name" in m and "no best-on-valid checkpoint" in m for m in messages)


def test_tester_score_with_default_every_test_warns():
    cfg = make_config(tester_score_name="test/acc")
    cfg.test_ds_name = COMPONENTS
    messages = [str(w.message) for w in _warnings_from(cfg)]
    assert any("every_test" in m and "no best-on-test checkpoint" in m for m in messages)


@pytest.mark.parametrize("factor", [2, 0, -2])
def test_score_factor_other_than_plus_or_minus_one_warns(factor):
    cfg = make_config(score_name="valid/acc", score_factor=factor)
    cfg.valid_ds_name = COMPONENTS
    caught = _warnings_from(cfg)
    assert len(caught) == 1 and caught[0].filename == __file__
    assert "MAXIMUM" in str(caught[0].message) and "-1" in str(caught[0].message)


@pytest.mark.parametrize("factor", [1, -1])
def test_score_factor_of_one_or_minus_one_is_quiet(factor, strict_warnings):
    cfg = make_config(score_name="valid/loss", score_factor=factor)
    cfg.valid_ds_name = COMPONENTS
    validate_config(cfg)


def test_no_score_name_means_no_scoring_warnings(strict_warnings):
    validate_config(make_config(score_factor=3, every_val=0))


# ----------------------------------------------------------------------------- check_dispatch


def _dispatch_error(cfg) -> str:
    with pytest.raises(ConfigError) as info:
        check_dispatch(cfg)
    return str(info.value)


def test_resolving_config_is_returned():
    cfg = make_config(
        aug_name=COMPONENTS,
        lr_scheduler=COMPONENTS,
        criterion_params={"dict_of_loss_params": {"ce": {"cls_name": COMPONENTS}}},
        val_metrics={"acc": {"cls_name": COMPONENTS, "params": {}}},
        train_ds_params={"sampler_params": {"cls_name": COMPONENTS}},
        logger_name=["text", "pbar", COMPONENTS],
    )
    cfg.valid_ds_name = COMPONENTS
    assert check_dispatch(cfg) is cfg


def test_two_broken_fields_are_reported_together():
    message = _dispatch_error(make_config(model_name=MISSING, optimizer_name=MISSING))
    assert message.startswith("2 dotted path(s) in this config do not resolve:\n\n  - ")
    assert "config field 'model_name'" in message
    assert "config field 'optimizer_name'" in message


def test_all_nine_component_fields_are_checked():
    fields = (
        "main_runner",
        "model_name",
        "train_ds_name",
        "valid_ds_name",
        "test_ds_name",
        "aug_name",
        "criterion_name",
        "optimizer_name",
        "lr_scheduler",
    )
    cfg = make_config()
    for field in fields:
        cfg[field] = MISSING
    message = _dispatch_error(cfg)
    assert message.startswith("9 dotted path(s)")
    for field in fields:
        assert f"config field '{field}'" in message


def test_module_missing_its_entrypoint_lists_what_it_has():
    message = _dispatch_error(make_config(optimizer_name="cli_fixtures.trainer"))
    assert "1 dotted path(s)" in message
    assert "must expose 'get_optimizer'" in message
    assert "Found:" in message and "Trainer" in message


@pytest.mark.parametrize("path", [".", "/", ".models.mlp", "models/mlp", "a..b", "a.b-c"])
def test_a_path_that_is_not_dotted_python_is_a_config_error(path):
    # The fuzz test found these: importlib raised TypeError for '.' and pytest's import hook
    # ValueError for '/', both tracebacks instead of a config error.
    message = _dispatch_error(make_config(model_name=path))
    assert "is not a dotted module path" in message
    assert "config field 'model_name'" in message


def test_falsy_component_fields_are_not_checked():
    check_dispatch(make_config(aug_name=None, lr_scheduler=""))


def test_loss_metric_and_sampler_entries_are_checked():
    cfg = make_config(
        criterion_params={"dict_of_loss_params": {"ce": {"cls_name": MISSING, "weight": 1.0}}},
        train_metrics={"acc": {"cls_name": MISSING}, "no_class": {"params": {}}},
        tester_metrics={"f1": {"cls_name": MISSING}},
        train_ds_params={"sampler_params": {"cls_name": MISSING}},
    )
    cfg.valid_ds_params = {"sampler_params": {"cls_name": MISSING}}
    message = _dispatch_error(cfg)
    assert message.startswith("5 dotted path(s)")
    for label in (
        "dict_of_loss_params.ce.cls_name",
        "train_metrics.acc.cls_name",
        "tester_metrics.f1.cls_name",
        "train_ds_params.sampler_params.cls_name",
        "valid_ds_params.sampler_params.cls_name",
    ):
        assert f"config field '{label}'" in message


def test_collate_fn_paths_are_left_to_build_time():
    check_dispatch(make_config(train_ds_params={"collate_fn": {"cls_name": MISSING}}))


def test_logger_entries_skip_pbar_and_builtin_short_names():
    cfg = make_config(logger_name=["pbar", "text", "wandb", "discord", MISSING])
    message = _dispatch_error(cfg)
    assert message.startswith("1 dotted path(s)")
    assert "config field 'logger_name'" in message and MISSING in message


def test_row_added_to_contracts_at_run_time_is_checked(monkeypatch):
    row = ("teacher_name", "Model", "A second model.", ("teacher_name",))
    monkeypatch.setattr(dispatch, "CONTRACTS", (*dispatch.CONTRACTS, row))
    cfg = make_config()
    cfg.teacher_name = MISSING
    message = _dispatch_error(cfg)
    assert message.startswith("1 dotted path(s)")
    assert "config field 'teacher_name'" in message
    cfg.teacher_name = COMPONENTS
    check_dispatch(cfg)


def test_a_refused_assignment_in_a_config_file_names_its_line(tmp_path):
    path = tmp_path / "bad_shape.py"
    path.write_text(
        "from gatle_ignite import base_config\n\n\ndef get_config():\n"
        "    cfg = base_config()\n    cfg.max_epochs = 'many'\n    return cfg\n"
    )
    with pytest.raises(ConfigError, match=r"bad_shape.py, line 6: the ConfigDict refused"):
        load_config_from_file(path)


def test_other_errors_in_a_config_file_propagate(tmp_path):
    path = tmp_path / "buggy.py"
    path.write_text("def get_config():\n    raise ValueError('my own bug')\n")
    with pytest.raises(ValueError, match="my own bug"):
        load_config_from_file(path)
