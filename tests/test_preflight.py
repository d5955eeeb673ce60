"""The pre-flight's promise: a config ``gatle-ignite config`` accepts never fails for a config
reason at the start of ``train``, and a refused one creates nothing. What needs a batch is the
dry run's. A checkpoint that does not fit the config's model, and a run directory given as
``--ckpt``, are config errors that say why."""

import contextlib
import io
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gatle_ignite.cli.main import main
from tests.test_fuzz_config import FIELDS as FUZZED_FIELDS
from tests.test_fuzz_config import _keep_it_small
from tests.test_fuzz_config import _write_config as _write_fuzzed_config
from tests.test_fuzz_config import values as fuzzed_values
from tests.toy.config import toy_config
from tests.toy.config_file import write_toy_config
from tests.toy.trainer import Trainer

# Small and quick: one epoch of two iterations, one validation batch.
QUICK = {"max_epochs": 1, "train_length": 2, "val_length": 1}

# A package of the test's own, so a misspelt module has siblings to be told apart from.
PACKAGE = "preflight_models"

COSINE = "lr_scheduler=gatle_ignite.schedulers.cosine"
PLATEAU = "lr_scheduler=gatle_ignite.schedulers.plateau"
ACC = {"acc": {"cls_name": "tests.toy.metric", "params": {"src_nme": "logits"}}}
CE = {"dict_of_loss_params": {"ce": {"cls_name": "tests.toy.loss", "weight": 1.0}}}
BUILTIN_CE = "gatle_ignite.losses.cross_entropy"


def _loss_metric(**params):
    return {"loss": {"cls_name": "gatle_ignite.metrics.loss", "params": params}}


def _loss_entry(**entry):
    return {"dict_of_loss_params": {"ce": {"cls_name": "tests.toy.loss", **entry}}}


BUILTIN_CE = "gatle_ignite.losses.cross_entropy"


def _builtin_entry(**entry):
    return {"dict_of_loss_params": {"ce": {"cls_name": BUILTIN_CE, **entry}}}


@pytest.fixture(autouse=True)
def project(monkeypatch, tmp_path):
    """The working directory holds a package of models; it leaves sys.modules as it found it."""
    monkeypatch.delenv("DISCORD_WEBHOOK_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / PACKAGE).mkdir()
    (tmp_path / PACKAGE / "mlp.py").write_text("from tests.toy.model import Model  # noqa\n")
    yield
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


def _run(capsys, command, config, *overrides, extra=()):
    code = main([command, f"--config={config}", *(f"--override={o}" for o in overrides), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _verdict(err: str) -> str:
    """The config error, without the warnings printed before it (shown once per process)."""
    assert "\nconfig error: " in err, err
    return err[err.index("\nconfig error: ") :]


# (config fields, overrides, phrases the verdict must hold: the field and its fix)
MISTAKES = {
    "amp dtype": ({}, ["amp_dtype=bf17"], ["amp_dtype must be one of", "'bf16'", "'bf17'"]),
    "accumulation": ({}, ["accum_steps=0"], ["accum_steps must be an integer >= 1"]),
    "score name": (
        {},
        ["score_name=valid/accuracy"],
        ["cfg.score_name = 'valid/accuracy'", "Did you mean 'valid/acc'?"],
    ),
    "optimizer keyword": (
        {},
        ["optimizer_params.lrr=1e-3"],
        ["optimizer_params.lrr:", "takes no keyword 'lrr'", "Did you mean 'lr'?"],
    ),
    "cosine keyword": (
        {},
        [COSINE, "lr_scheduler_params.cycle_epoch=2"],
        ["lr_scheduler_params.cycle_epoch:", "Did you mean 'cycle_epochs'?"],
    ),
    "plateau keyword reaching torch": (
        {},
        [PLATEAU, "lr_scheduler_params.patiense=2"],
        ["lr_scheduler_params.patiense:", "Did you mean 'patience'?"],
    ),
    "model keyword": (
        {"model_params": {"hiden": 8}},
        [],
        ["model_params.hiden:", "tests.toy.model.Model", "Did you mean 'hidden'?"],
    ),
    "loss keyword": (
        {"criterion_params": _loss_entry(weight=1.0, loss_params={"src_nam": "logits"})},
        [],
        ["criterion_params.dict_of_loss_params.ce.loss_params.src_nam:", "'src_name'"],
    ),
    "loss entry key": (
        {"criterion_params": _loss_entry(wieght=1.0)},
        [],
        ["loss entry 'ce' has 'wieght'", "did you mean 'weight'?"],
    ),
    "criterion without its keyword": (
        {"criterion_params": {}},
        [],
        ["criterion_params lacks 'dict_of_loss_params'"],
    ),
    "built-in loss keyword reaching torch": (
        {"criterion_name": BUILTIN_CE, "criterion_params": {"label_smothing": 0.1}},
        [],
        ["criterion_params.label_smothing:", "Did you mean 'label_smoothing'?"],
    ),
    "built-in loss term keyword": (
        {"criterion_params": _loss_entry(weight=1.0, cls_name=BUILTIN_CE, loss_params={"tgt": 1})},
        [],
        ["criterion_params.dict_of_loss_params.ce.loss_params.tgt:", "takes no keyword 'tgt'"],
    ),
    "built-in metric keyword reaching ignite": (
        {
            "val_metrics": {
                "acc": {
                    "cls_name": "gatle_ignite.metrics.accuracy",
                    "params": {"is_multilable": True},
                }
            }
        },
        [],
        ["val_metrics.acc.params.is_multilable:", "Did you mean 'is_multilabel'?"],
    ),
    "loss metric keyword reaching its loss": (
        {"val_metrics": _loss_metric(ignore_indx=-1)},
        [],
        ["val_metrics.loss.params.ignore_indx:", "gatle_ignite.losses.cross_entropy.Loss"],
    ),
    "loss metric naming no loss": (
        {"val_metrics": _loss_metric(loss_name="gatle_ignite.losses.cross_entrop")},
        [],
        ["config field 'val_metrics.loss.params.loss_name'", "Did you mean"],
    ),
    "metric keyword": (
        {"val_metrics": ACC},
        [],
        ["val_metrics.acc.params.src_nme:", "Did you mean 'src_name'?"],
    ),
    "loader key": (
        {},
        ["train_ds_params.num_worker=0"],
        ["train_ds_params.num_worker: did you mean 'num_workers'?"],
    ),
    "misspelt module": (
        {},
        [f"model_name={PACKAGE}.mlpp"],
        ["config field 'model_name'", f"Did you mean '{PACKAGE}.mlp'?"],
    ),
    "swapped letters in a module": (
        {},
        [f"model_name={PACKAGE}.mpl"],
        ["config field 'model_name'", f"Did you mean '{PACKAGE}.mlp'?"],
    ),
    "one wrong letter in a built-in, beside a shorter one": (
        {},
        ["optimizer_name=gatle_ignite.optimizers.adamv"],
        ["config field 'optimizer_name'", "Did you mean 'gatle_ignite.optimizers.adamw'?"],
    ),
    "misspelt built-in": (
        {},
        ["lr_scheduler=gatle_ignite.schedulers.cosin"],
        ["config field 'lr_scheduler'", "Did you mean 'gatle_ignite.schedulers.cosine'?"],
    ),
    "misspelt backend": (
        {},
        ["logger_name=['txt']"],
        ["config field 'logger_name'", "Did you mean the built-in 'text'?"],
    ),
    "a class for a module": (
        {},
        ["main_runner=tests.toy.trainer.Trainer"],
        ["config field 'main_runner'", "Write 'tests.toy.trainer'."],
    ),
    "early stop on no engine": (
        {},
        ["early_stop_patience=2", "every_val=0"],
        ["cfg.early_stop_patience asks to stop on the 'valid' engine"],
    ),
    "topology": ({}, ["nnodes=0"], ["nnodes must be >= 1"]),
    "warm start from no file": (
        {},
        ["model_checkpoint_dir=nowhere.pt"],
        ["model_checkpoint_dir 'nowhere.pt' is not a file"],
    ),
    "plateau with no metric": (
        {},
        [PLATEAU, "score_name=None"],
        ["plateau scheduler has no metric to watch"],
    ),
    "plateau with no evaluator": (
        {},
        [PLATEAU, "every_val=0"],
        ["the plateau scheduler steps after each evaluator run"],
    ),
    "discord with no webhook": (
        {},
        ["logger_name=['discord']"],
        ["logger_name names 'discord', but no webhook URL is set"],
    ),
    # Values the constructors refuse: the built-ins are built on stand-ins.
    "negative learning rate": (
        {},
        ["optimizer_params.lr=-0.001"],
        ["optimizer_params.lr: Invalid learning rate: -0.001", "fix cfg.optimizer_params.lr"],
    ),
    "beta out of range": (
        {},
        ["optimizer_params.betas=[0.9, 1.5]"],
        ["optimizer_params.betas: Invalid beta parameter at index 1: 1.5"],
    ),
    "negative momentum": (
        {},
        ["optimizer_name=gatle_ignite.optimizers.sgd", "optimizer_params.momentum=-0.5"],
        ["optimizer_params.momentum: Invalid momentum value: -0.5"],
    ),
    "plateau factor": (
        {},
        [PLATEAU, "lr_scheduler_params.factor=2.0"],
        ["lr_scheduler_params not accepted by", "Factor should be < 1.0."],
    ),
    "plateau mode": (
        {},
        [PLATEAU, "lr_scheduler_params.mode=middle"],
        ["lr_scheduler_params.mode: mode middle is unknown!"],
    ),
    "built-in loss value": (
        {"criterion_name": BUILTIN_CE, "criterion_params": {"weight": "heavy"}},
        [],
        [f"criterion_params not accepted by {BUILTIN_CE}.Loss", "cannot assign 'str'"],
    ),
    "built-in loss term value": (
        {"criterion_params": _builtin_entry(weight=1.0, loss_params={"weight": "heavy"})},
        [],
        [
            "criterion_params.dict_of_loss_params.ce.loss_params not accepted by "
            f"{BUILTIN_CE}.Loss",
            "cannot assign 'str'",
        ],
    ),
}


@pytest.mark.parametrize(("fields", "overrides", "phrases"), MISTAKES.values(), ids=MISTAKES)
def test_config_and_train_refuse_a_mistake_alike_and_create_nothing(
    tmp_path, capsys, fields, overrides, phrases
):
    save_dir = tmp_path / "run"
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(save_dir), **QUICK, **fields)
    verdicts = {}
    for command in ("config", "train"):
        code, out, err = _run(capsys, command, config, *overrides)
        assert code == 2, (command, out, err)
        assert "Traceback" not in out + err
        verdicts[command] = _verdict(err)
    assert verdicts["config"] == verdicts["train"]
    for phrase in phrases:
        assert phrase in verdicts["config"]
    assert not save_dir.exists()


def test_a_module_named_like_a_builtin_failing_on_its_own_import_is_not_sent_to_the_builtin(
    tmp_path, capsys
):
    (tmp_path / PACKAGE / "accuracy.py").write_text("import gi_test_package_not_installed\n")
    metrics = {"acc": {"cls_name": f"{PACKAGE}.accuracy"}}
    config = write_toy_config(
        tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), val_metrics=metrics
    )
    code, _out, err = _run(capsys, "config", config)
    assert code == 2
    verdict = _verdict(err)
    assert "No module named 'gi_test_package_not_installed'" in verdict
    assert "install the missing package" in verdict
    assert "gatle_ignite.metrics.accuracy" not in verdict


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(field=st.sampled_from(FUZZED_FIELDS), value=fuzzed_values, raw=st.booleans())
def test_a_config_that_config_accepts_trains(tmp_path, field, value, raw):
    _keep_it_small(field, value)
    # fp16 needs a CUDA device, which is where the run is, not what the config says.
    assume(not (field == "amp_dtype" and value == "fp16"))
    save_dir = tmp_path / "run"
    shutil.rmtree(save_dir, ignore_errors=True)
    config = tmp_path / "fuzzed.py"
    _write_fuzzed_config(config, save_dir, None)
    override = f"--override={field}={str(value) if raw else repr(value)}"
    codes, errors = {}, {}
    for command in ("config", "train"):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            codes[command] = main([command, f"--config={config}", override])
        errors[command] = err.getvalue()
        if codes[command] != 0:
            break
    assert codes["config"] == 2 or codes["train"] == 0, errors
    if codes["config"] == 2:
        assert not save_dir.exists()


def _kwargs_model(tmp_path) -> str:
    (tmp_path / PACKAGE / "open_model.py").write_text(
        "from tests.toy.model import Model as Toy\n\n\n"
        "def Model(**kwargs):\n"
        "    return Toy(hidden=kwargs.get('width', 16))\n"
    )
    return f"{PACKAGE}.open_model"


def _own_optimizer_trainer(tmp_path) -> str:
    (tmp_path / PACKAGE / "own_trainer.py").write_text(
        "import torch\n\n"
        "from tests.toy.trainer import Trainer as Toy\n\n\n"
        "class Trainer(Toy):\n"
        "    def build_optimizer(self):\n"
        "        params = self.cfg.optimizer_params\n"
        "        lr = params['lr'] * params.get('scale', 1.0)\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)\n"
        "        return self.optimizer\n"
    )
    return f"{PACKAGE}.own_trainer"


# (the component the test's own module replaces, overrides): each takes what it is given.
ACCEPTED = {
    "a keyword the built-in passes on to torch": (None, ["optimizer_params.amsgrad=True"]),
    "a keyword the cosine passes on to ignite": (
        None,
        [COSINE, "lr_scheduler_params.cycle_mult=2.0"],
    ),
    "a keyword the plateau passes on through ignite to torch": (
        None,
        [PLATEAU, "lr_scheduler_params.threshold=0.01"],
    ),
    "a built-in loss named as the criterion, with torch's keyword": (
        None,
        [f"criterion_name={BUILTIN_CE}", "criterion_params={'label_smoothing': 0.1}"],
    ),
    "a built-in metric with ignite's keyword, and the loss metric with its loss's": (
        None,
        [
            "val_metrics={'acc': {'cls_name': 'gatle_ignite.metrics.accuracy', 'params': "
            "{'is_multilabel': False}}, 'loss': {'cls_name': 'gatle_ignite.metrics.loss', "
            "'params': {'label_smoothing': 0.1, 'tgt_name': 'labels'}}}",
        ],
    ),
    "any keyword to a model taking **kwargs": ("model_name", ["model_params.width=8"]),
    "any keyword to an optimizer the trainer builds itself": (
        "main_runner",
        ["optimizer_params.scale=0.5"],
    ),
}
OWN = {"model_name": _kwargs_model, "main_runner": _own_optimizer_trainer}


@pytest.mark.parametrize(("own", "overrides"), ACCEPTED.values(), ids=ACCEPTED)
def test_what_the_components_take_passes_and_trains(tmp_path, capsys, own, overrides):
    fields = {own: OWN[own](tmp_path)} if own else {}
    config = write_toy_config(
        tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **QUICK, **fields
    )
    for command in ("config", "train"):
        code, out, err = _run(capsys, command, config, *overrides)
        assert code == 0, (command, err)
    assert "TRAINING COMPLETE after" in out


# ----------------------------------------------------------------------------- the dry run


def _trainer_with_own_metrics(tmp_path) -> str:
    """A trainer overriding init_metrics: its metric names are known only once it has run."""
    (tmp_path / PACKAGE / "metrics_trainer.py").write_text(
        "from tests.toy.trainer import Trainer as Toy\n\n\n"
        "class Trainer(Toy):\n"
        "    def init_metrics(self, engine, engine_type, metrics_cfg, **kwargs):\n"
        "        return super().init_metrics(engine, engine_type, metrics_cfg, **kwargs)\n"
    )
    return f"{PACKAGE}.metrics_trainer"


def test_the_dry_run_refuses_a_score_name_its_metrics_do_not_include(tmp_path, capsys):
    save_dir = tmp_path / "run"
    config = write_toy_config(
        tmp_path / "cfg.py",
        save_dir=str(save_dir),
        main_runner=_trainer_with_own_metrics(tmp_path),
        score_name="valid/accuracy",
        **QUICK,
    )
    assert _run(capsys, "config", config)[0] == 0
    code, out, err = _run(capsys, "config", config, extra=["--dry-run"])
    assert code == 2
    assert "valid/acc: " in out  # computed, then the score field is checked against it
    verdict = _verdict(err)
    assert "dry run failed at the score check" in verdict
    assert "cfg.score_name = 'valid/accuracy'" in verdict and "Did you mean 'valid/acc'?" in verdict
    assert not save_dir.exists()


def test_the_dry_run_accepts_the_score_name_it_computed(tmp_path, capsys):
    config = write_toy_config(
        tmp_path / "cfg.py",
        save_dir=str(tmp_path / "run"),
        main_runner=_trainer_with_own_metrics(tmp_path),
        **QUICK,
    )
    assert _run(capsys, "config", config, extra=["--dry-run"])[0] == 0


# ----------------------------------------------------------------------------- config's output


def test_config_prints_what_differs_from_the_defaults(tmp_path, capsys):
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **QUICK)
    code, out, _err = _run(capsys, "config", config, "max_epochs=3")
    assert code == 0
    assert "fields that differ from the defaults (--all prints every field):" in out
    assert "\nmax_epochs: 3\n" in out and "\nmain_runner: tests.toy.trainer\n" in out
    # Only the keys of a group that differ: the group's default keys stay out.
    assert "\nauto_model_params:" not in out and "\nwatch_grad:" not in out
    assert "\noptimizer_params:\n  lr: 0.01\n" in out
    assert out.rstrip().endswith("all dotted paths resolve.")


def test_config_all_prints_every_field(tmp_path, capsys):
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **QUICK)
    code, out, _err = _run(capsys, "config", config, extra=["--all"])
    assert code == 0
    assert "differ from the defaults" not in out
    assert "\nwatch_grad: false\n" in out and "\nauto_model_params:\n" in out


def test_the_dry_run_does_not_print_the_config(tmp_path, capsys):
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **QUICK)
    code, out, _err = _run(capsys, "config", config, extra=["--dry-run"])
    assert code == 0
    assert "main_runner:" not in out and "differ from the defaults" not in out
    assert "[train split] one batch" in out


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture
def trained_wide(tmp_path):
    """A run trained with hidden=24, and its config file."""
    fields = {"save_dir": str(tmp_path / "run"), "model_params": {"hidden": 24}, **QUICK}
    Trainer(0, toy_config(**fields)).fit()
    return write_toy_config(tmp_path / "cfg.py", **fields), tmp_path / "run"


@pytest.mark.parametrize(
    "command",
    [
        ("eval",),
        ("predict", "--out", "preds.pt"),
        ("export", "--format", "safetensors", "--out", "exported"),
    ],
    ids=lambda command: command[0],
)
def test_a_checkpoint_of_another_model_names_the_tensors_and_the_fields(
    trained_wide, capsys, command
):
    config, save_dir = trained_wide
    code, out, err = _run(capsys, command[0], config, "model_params.hidden=8", extra=command[1:])
    assert code == 2
    assert "Traceback" not in out + err and "size mismatch" not in err
    verdict = _verdict(err)
    assert "does not fit the model this config builds" in verdict
    assert "net.0.weight: [24, 8] in the checkpoint, [8, 8] in this model" in verdict
    assert "net.3.weight: [3, 24] in the checkpoint, [3, 8] in this model" in verdict
    assert f"{save_dir / 'run.json'}" in verdict
    assert "model_params.hidden: 24 there, 8 here" in verdict
    assert not Path("preds.pt").exists() and not Path("exported").exists()


def test_a_checkpoint_of_another_model_in_a_run_without_a_record_says_so(trained_wide, capsys):
    config, save_dir = trained_wide
    (save_dir / "run.json").unlink()
    code, _out, err = _run(capsys, "eval", config, "model_params.hidden=8")
    assert code == 2
    assert f"There is no readable {save_dir / 'run.json'}" in _verdict(err)


def test_the_checkpoint_of_the_same_config_still_evaluates(trained_wide, capsys):
    config, _save_dir = trained_wide
    code, out, _err = _run(capsys, "eval", config)
    assert code == 0 and "valid/acc: " in out


def test_a_run_directory_as_ckpt_says_what_to_pass(trained_wide, capsys):
    config, save_dir = trained_wide
    code, _out, err = _run(capsys, "eval", config, extra=["--ckpt", str(save_dir)])
    assert code == 2
    verdict = _verdict(err)
    assert f"--ckpt '{save_dir}' is a run directory, not a checkpoint" in verdict
    assert "It is this config's save_dir: pass --ckpt best or --ckpt latest" in verdict
    assert "incomplete sharded checkpoint" not in verdict
    # A config whose save_dir is elsewhere is told to point it there.
    code, _out, err = _run(
        capsys, "eval", config, "save_dir=elsewhere", extra=["--ckpt", str(save_dir)]
    )
    assert code == 2
    assert f"--override save_dir={save_dir} --ckpt best" in _verdict(err)
