"""The everyday run through the CLI: what it prints, what it keeps, and the mistakes it catches
before the first epoch, each one error with its fix (exit 2, no traceback)."""

import csv
import re
import shlex
import subprocess
import sys
import traceback

import pytest

from gatle_ignite import ConfigError
from gatle_ignite.cli.main import main
from tests.conftest import HANG_S, ROOT
from tests.toy.config import toy_config
from tests.toy.config_file import write_toy_config
from tests.toy.trainer import Trainer

BASE = {"train_ds_params": {"n": 64, "bs": 16, "shuffle": True, "seed": 0}, "max_epochs": 2}


def _config(tmp_path, trainer="tests.toy.trainer", **fields) -> str:
    fields = {**BASE, "save_dir": str(tmp_path / "run"), "main_runner": trainer, **fields}
    return write_toy_config(tmp_path / "cfg.py", **fields)


@pytest.fixture
def train(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)

    def run(config, *overrides):
        code = main(["train", f"--config={config}", *(f"--override={o}" for o in overrides)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _refused_before_training(result, *phrases):
    code, out, err = result
    assert code == 2, err
    for phrase in phrases:
        assert phrase in err
    assert "Traceback" not in err and "terminating due to exception" not in err
    assert "TRAIN epoch" not in out


# ---- mistakes caught before the first step completes ----


def test_a_prep_batch_returning_a_tuple_is_one_clear_error(tmp_path, train):
    config = _config(tmp_path, "tests.toy.bad_trainers.returns_tuple")
    _refused_before_training(
        train(config),
        'prep_batch(batch, split="train") returned a tuple of 2 item(s)',
        '"model_input"',
    )


def test_a_prep_batch_without_model_input_is_one_clear_error(tmp_path, train):
    config = _config(tmp_path, "tests.toy.bad_trainers.no_model_input")
    _refused_before_training(train(config), "returned a dict with keys ['inputs', 'targets']")


def test_a_model_refusing_the_model_input_keys_is_one_clear_error(tmp_path, train):
    config = _config(tmp_path, "tests.toy.bad_trainers.wrong_keys")
    _refused_before_training(
        train(config), "does not accept the model_input keys ['inputs']", "forward(x)"
    )


HF_IMAGE = {"model_name": "tests.toy.hf_image_model"}


def test_a_model_input_key_a_pass_through_forward_refuses_is_one_clear_error(tmp_path, train):
    # forward(**inputs) takes `inputs`; the model it passes them to refuses the keyword.
    model = {"model_name": "tests.toy.kwargs_model"}
    _refused_before_training(
        train(_config(tmp_path, "tests.toy.bad_trainers.wrong_keys", **model)),
        "does not accept the model_input keys ['inputs'] that prep_batch (",
        "tests/toy/bad_trainers/wrong_keys.py:7) returned",
        "got an unexpected keyword argument 'inputs'",
        "tests.toy.kwargs_model.Model.forward names []; not ['inputs'].",
    )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
def test_a_model_input_key_a_transformers_model_takes_unnamed_is_noted_on_its_error(
    tmp_path, train
):
    pytest.importorskip("transformers")
    # forward(pixel_values=None, ..., **kwargs) takes `img` unnamed, then fails on its own:
    # its error stands, with the keys and the parameters beside it.
    config = _config(tmp_path, "tests.toy.bad_trainers.image_key", **HF_IMAGE)
    printed = _raised(lambda: train(config))
    assert "AttributeError: 'NoneType' object has no attribute 'shape'" in printed
    assert (
        "Of the model_input keys ['img'] that prep_batch (" in printed
        and "tests/toy/image_trainer.py:10) returned, transformers.models.resnet.modeling_resnet."
        "ResNetForImageClassification.forward names ['pixel_values', 'labels', "
        "'output_hidden_states', 'return_dict']; not ['img'], which its **kwargs took."
        in printed
    )


def _raised(call) -> str:
    """The traceback Python prints for what ``call`` raises, its notes included."""
    with pytest.raises(Exception) as info:
        call()
    return "".join(traceback.format_exception(info.value))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
def test_an_error_raised_inside_a_library_names_the_config_field_that_built_the_model(
    tmp_path, train
):
    pytest.importorskip("transformers")
    # Three channels for the toy's one-channel images: transformers' own check refuses them.
    fields = {**HF_IMAGE, "model_params": {"num_channels": 3, "embedding_size": 8}}
    config = _config(tmp_path, "tests.toy.image_trainer", **fields)
    printed = _raised(lambda: train(config))
    assert "ValueError: Make sure that the channel dimension of the pixel values match" in printed
    assert (
        "ValueError raised inside transformers (transformers/models/resnet/modeling_resnet.py:"
        in printed
    )
    assert (
        "in the model built from model_name = 'tests.toy.hf_image_model' and model_params = "
        "{embedding_size=8, num_channels=3}." in printed
    )
    assert "The message speaks of model_params.num_channels: check its value." in printed
    assert "model_input: pixel_values float32[16, 1, 2, 4]" in printed


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
def test_an_error_raised_inside_a_library_building_the_model_names_the_field(tmp_path, train):
    pytest.importorskip("transformers")
    fields = {**HF_IMAGE, "model_params": {"hidden_act": "rleu"}}
    printed = _raised(lambda: train(_config(tmp_path, "tests.toy.image_trainer", **fields)))
    assert "raised inside transformers (transformers/" in printed
    assert (
        "while building tests.toy.hf_image_model.Model(**model_params) from model_params = "
        "{hidden_act='rleu'}." in printed
    )
    assert "The message speaks of model_params.hidden_act" in printed


BARE_OUTPUT = {"model_name": "tests.toy.tensor_model"}
INDEXING_LOSS = {
    "dict_of_loss_params": {"ce": {"cls_name": "tests.toy.indexing_loss", "weight": 1}}
}


def test_a_model_returning_a_bare_tensor_is_one_clear_error(tmp_path, train):
    _refused_before_training(
        train(_config(tmp_path, **BARE_OUTPUT)),
        "could not resolve 'logits'; available: <class 'torch.Tensor'> of shape [16, 3]",
        "forward must return a dict of named outputs",
    )


@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence")
def test_a_loss_indexing_a_bare_tensor_output_is_one_clear_error(tmp_path, train):
    _refused_before_training(
        train(_config(tmp_path, criterion_params=INDEXING_LOSS, **BARE_OUTPUT)),
        "forward returned a Tensor of shape [16, 3], but it must return a dict",
    )


def test_an_evaluation_of_a_bare_tensor_output_is_one_clear_error(make_cfg):
    task = Trainer(0, make_cfg(run=True, **BARE_OUTPUT))
    with pytest.raises(ConfigError, match="forward must return a dict of named outputs"):
        task.evaluate(load_checkpoint=False)


def test_a_score_name_no_engine_produces_is_refused_before_training(tmp_path, train):
    config = _config(tmp_path, score_name="valid/accuracy")
    _refused_before_training(train(config), "cfg.score_name = 'valid/accuracy'", "['valid/acc']")
    assert not (tmp_path / "run" / "latest_epoch_checkpoint_1.pt").exists()


def test_an_empty_training_split_is_refused_at_start(tmp_path, train):
    loader = {"n": 8, "bs": 16, "drop_last": True}
    _refused_before_training(
        train(_config(tmp_path, train_ds_params=loader)), "the train split yields no batch"
    )


def test_an_empty_evaluation_split_is_refused_at_start(tmp_path, train):
    _refused_before_training(
        train(_config(tmp_path, valid_ds_params={"n": 0, "bs": 16})),
        "the valid split yields no batch",
    )


# ---- output ----


def test_a_run_prints_progress_epoch_blocks_and_a_summary_and_no_ignite_info(tmp_path, train):
    code, out, err = train(_config(tmp_path, logger_name=["text"]))
    assert code == 0
    assert "auto_dataloader" not in err and "INFO" not in err
    progress = [line for line in out.splitlines() if " TRAIN epoch " in line]
    assert progress and all(
        re.search(r"loss [\d.e+-]+ \| [\d.]+k? it/s, [\d.]+k? samples/s \| elapsed", line)
        for line in progress[1:]
    )
    assert out.count("--- epoch 2/2 (iteration 8) ---") == 1
    block = out.split("--- epoch 2/2 (iteration 8) ---\n")[1].splitlines()
    assert block[0].startswith("train  loss_avg ") and block[1].startswith("valid  acc ")
    # Numbers at 5 significant digits, not 16.
    assert all(len(token.replace(".", "")) <= 6 for token in re.findall(r"\d\.\d+", block[0]))
    summary = out[out.index("TRAINING COMPLETE") :]
    for line in ("best     valid/acc", "latest   ", "logs     ", "evaluate gatle-ignite eval"):
        assert line in summary
    assert "--override resume=True" in summary and "metrics.csv" in summary


@pytest.mark.parametrize("verbosity", [1, 2])
def test_ignites_info_lines_only_at_verbosity_2(tmp_path, verbosity):
    # A process of its own: ignite's loggers keep the stream they were created with.
    done = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={_config(tmp_path)}"]
        + [f"--override=verbosity={verbosity}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    assert ("auto_dataloader" in done.stderr) == (verbosity == 2)


def test_a_framework_warning_is_its_message_without_the_code_that_raised_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gatle_ignite", "train", f"--config={_config(tmp_path)}"]
        + ["--override=resume=True", "--override=max_epochs=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    warning = next(i for i, line in enumerate(lines) if "starts from scratch" in line)
    assert lines[warning].startswith("warning: ")
    # Python's format would add the raising file and its source line.
    assert "UserWarning" not in done.stderr and ".py:" not in done.stderr


def test_every_run_keeps_its_history_with_the_loss_every_log_every_steps(tmp_path, train):
    assert train(_config(tmp_path, logger_name=["text"], log_every=2))[0] == 0
    with open(tmp_path / "run" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    losses = [(row["epoch"], row["step"]) for row in rows if row["name"] == "train/loss"]
    assert losses == [("1", "2"), ("1", "4"), ("2", "6"), ("2", "8")]
    accuracy = [(row["epoch"], row["step"]) for row in rows if row["name"] == "valid/acc"]
    assert accuracy == [("1", "4"), ("2", "8")]


def _history(save_dir) -> list:
    with open(save_dir / "metrics.csv", newline="") as handle:
        return [(row["name"], row["step"]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize("sinks", [["text"], ["text", "tensorboard"]])
def test_a_resume_from_an_older_checkpoint_logs_the_retrained_stretch_once(
    tmp_path, train, sinks, monkeypatch
):
    if "tensorboard" in sinks:
        from tensorboard.summary.writer import event_file_writer

        # Event file names end in a process-wide count: from 8, the resume's files are the
        # 9th and 10th, and "...10" sorts before "...8" when the seconds before it are alike.
        monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(8))
    config = _config(tmp_path, logger_name=sinks, log_every=2, n_saved=None)
    assert train(config)[0] == 0
    straight = _history(tmp_path / "run")
    # The newest checkpoint lost: the resume trains epoch 2 again, and logs it again.
    for newest in (tmp_path / "run").glob("*_2*.pt"):
        newest.unlink()
    assert train(config, "resume=True", "max_epochs=3")[0] == 0
    history = _history(tmp_path / "run")
    assert len(history) == len(set(history))
    assert history[: len(straight)] == straight
    if "tensorboard" in sinks:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
        events.Reload()
        steps = [event.step for event in events.Scalars("train/loss")]
        assert steps == [2, 4, 6, 8, 10, 12]


def test_pbar_shows_the_loss_and_still_prints_epoch_metrics(tmp_path, train, monkeypatch):
    # Bars on a terminal only (elsewhere the text lines): this stream says it is one.
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    code, out, err = train(_config(tmp_path, logger_name=["pbar"]))
    assert code == 0
    assert "--- epoch 1/2 (iteration 4) ---" in out and "valid  acc " in out
    assert "loss=" in err and "it/s" in err
    assert " TRAIN epoch " not in out


def test_a_short_run_logs_enough_points_to_draw_its_schedule(tmp_path, train):
    # 220 iterations in one epoch: with a fixed 100 the schedule had points at 100 and 200 only.
    config = _config(
        tmp_path,
        train_ds_params={"n": 440, "bs": 2, "seed": 0},
        max_epochs=1,
        lr_scheduler="gatle_ignite.schedulers.warmup_cosine",
    )
    assert train(config)[0] == 0
    steps = [int(step) for name, step in _history(tmp_path / "run") if name == "train/lr_0"]
    assert steps == list(range(11, 221, 11))
    losses = [int(step) for name, step in _history(tmp_path / "run") if name == "train/loss"]
    assert losses == steps


def test_eval_prints_its_values_at_5_significant_digits_as_training_does(tmp_path, cli):
    scripted = {"acc": {"cls_name": "tests.toy.scripted_metric", "params": {"values": [1 / 3]}}}
    config = _config(tmp_path, val_metrics=scripted, logger_name=["text"])
    code, trained, _err = cli("train", config)
    assert code == 0 and "valid  acc 0.33333\n" in trained
    code, out, err = cli("eval", config)
    assert code == 0, err
    assert "valid/acc: 0.33333\n" in out


def test_a_cli_run_ends_in_one_line_and_a_script_in_its_own(tmp_path, train, capsys):
    code, out, _err = train(_config(tmp_path, max_epochs=1))
    assert code == 0
    # One end line, the summary's first, in 0.4's words (CONTRACT 12.2), which users grep for.
    assert out.count("TRAINING COMPLETE") == 1
    assert "\nTRAINING COMPLETE after 1 epoch: 'toy', epoch 1/1 (iteration 4), " in out
    # Without the command's summary (a script calling fit()), the trainer says it, in English.
    Trainer(0, toy_config(save_dir=str(tmp_path / "script"), max_epochs=1)).fit()
    assert "TRAINING COMPLETE after 1 epoch\n" in capsys.readouterr().out


def _summary_command(out, label) -> list:
    line = next(line for line in out.splitlines() if line.startswith(f"  {label} "))
    return line.split(None, 1)[1]


def test_the_summarys_commands_read_plainly_and_run_as_printed(tmp_path, train):
    config = _config(tmp_path, max_epochs=1)
    overrides = ["max_epochs=2", "logger_name=['text', 'csv']", "optimizer_params.lr=0.02"]
    code, out, _err = train(config, *overrides)
    assert code == 0
    evaluate = _summary_command(out, "evaluate")
    resume = _summary_command(out, "resume")
    # One override style, the quotes a person would type, and no training-only field to eval.
    assert evaluate == (
        f"gatle-ignite eval --config={config} --override \"logger_name=['text', 'csv']\" "
        f"--ckpt best"
    )
    assert resume == (
        f"gatle-ignite train --config={config} --override max_epochs=2 "
        f"--override \"logger_name=['text', 'csv']\" --override optimizer_params.lr=0.02 "
        f"--override resume=True"
    )
    # As a shell reads them back, both commands run.
    assert main(shlex.split(evaluate)[1:]) == 0
    assert main(shlex.split(resume)[1:]) == 0


# ---- how a command ends ----


def _nan_from(iteration) -> dict:
    """A loss whose second term turns NaN at ``iteration``: the run diverges there."""
    return {
        "dict_of_loss_params": {
            "ce": {"cls_name": "tests.toy.loss", "weight": 1.0},
            "nan": {"cls_name": "tests.toy.nan_loss", "weight": 1.0, "start_iteration": iteration},
        }
    }


def _rows(out, label) -> list:
    """The summary's row under ``label`` and the rows that continue it (no label of their own)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {label} "))
    rows = [lines[start][11:]]
    for line in lines[start + 1 :]:
        if not line.startswith(" " * 11):
            break
        rows.append(line[11:])
    return rows


def test_a_diverged_run_exits_65_and_its_resume_says_it_repeats_what_diverged(tmp_path, train, cli):
    from gatle_ignite.trainer.lifecycle import EXIT_DIVERGED

    # 4 iterations an epoch: epoch 1 is saved, epoch 2 diverges at iteration 7.
    config = _config(tmp_path, criterion_params=_nan_from(7), logger_name=["text"])
    code, out, _err = train(config, "optimizer_params.lr=0.05")
    assert code == EXIT_DIVERGED == 65
    assert "TRAINING COMPLETE" not in out
    assert "\nTRAINING DIVERGED (non-finite loss at iteration 7): 'toy', epoch 2/2 " in out
    note, command = _rows(out, "resume")
    assert "resuming repeats the setting that diverged" in note
    assert "a lower learning rate" in note and "accept_changes=['optimizer_params.lr']" in note
    assert command.startswith("gatle-ignite train ") and command.endswith("--override resume=True")
    assert "--override optimizer_params.lr=0.05" in command
    # status says what train's exit code said.
    assert main(["status", str(tmp_path / "run")]) == EXIT_DIVERGED
    # Resumed as it stands, it diverges again, and says so again.
    code, out, _err = train(config, "optimizer_params.lr=0.05", "resume=True")
    assert code == EXIT_DIVERGED and "TRAINING DIVERGED" in out


def test_a_run_diverging_before_its_first_checkpoint_offers_nothing_to_resume(tmp_path, train):
    code, out, _err = train(_config(tmp_path, criterion_params=_nan_from(2)))
    assert code == 65
    assert "\nTRAINING DIVERGED (non-finite loss at iteration 2): 'toy', epoch 1/2 " in out
    [resume] = _rows(out, "resume")
    assert resume.startswith("nothing to resume: it diverged before its first checkpoint.")
    assert "train it again" in resume and "accept_changes" not in resume
    # Nor an eval of a checkpoint that does not exist.
    assert "gatle-ignite eval" not in out


def test_train_a_b_counts_a_diverged_config_as_failed(tmp_path, capsys):
    ok = write_toy_config(
        tmp_path / "cfg_ok.py", **{**BASE, "max_epochs": 1}, save_dir=str(tmp_path / "ok")
    )
    diverging = write_toy_config(
        tmp_path / "cfg_diverging.py",
        **BASE,
        save_dir=str(tmp_path / "diverging"),
        criterion_params=_nan_from(2),
    )
    code = main(["train", f"--config={ok},{diverging}"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "[cfg_diverging] TRAINING DIVERGED (non-finite loss at iteration 2)" in out
    assert "[cfg_ok] TRAINING COMPLETE after 1 epoch: " in out
    assert out.endswith("\n\nFailed configs: cfg_diverging\n")
