"""``gatle-ignite lr-find``: a suggestion and a plot, and nothing of the run changed or saved."""

import hashlib
import re
import sys
from functools import partial

import pytest
import torch
from ignite.engine import Engine
from matplotlib.image import imread

from gatle_ignite.cli import lr_find
from gatle_ignite.cli.lr_find import LRSearch, find_lr
from gatle_ignite.cli.main import main
from tests.toy.config import toy_config
from tests.toy.config_file import write_toy_config
from tests.toy.model import Model
from tests.toy.trainer import Trainer


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def _digest(state_dict) -> str:
    digest = hashlib.sha256()
    for key, value in state_dict.items():
        digest.update(key.encode())
        digest.update(value.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def _built(tmp_path):
    return Trainer(0, toy_config(save_dir=str(tmp_path / "run"), run=True)).setup()


def test_the_search_leaves_the_weights_and_the_optimizer_as_they_were(tmp_path):
    trainer = _built(tmp_path)
    weights = _digest(trainer.model.state_dict())
    optimizer = repr(trainer.optimizer.state_dict())
    search = find_lr(trainer, start_lr=1e-6, end_lr=10.0, num_iter=30)
    assert _digest(trainer.model.state_dict()) == weights
    assert repr(trainer.optimizer.state_dict()) == optimizer
    assert 1e-6 <= search.suggestion <= 10.0
    assert len(search.lrs) == len(search.losses) <= 31
    assert search.lrs == sorted(search.lrs)
    # Each loss stands beside the rate its step ran at: the first at start_lr.
    assert search.lrs[0] == 1e-6
    assert search.suggestion in search.lrs


def test_the_digest_sees_what_one_training_epoch_changes(tmp_path):
    # The control: the same steps without the finder do move the weights.
    trainer = _built(tmp_path)
    weights = _digest(trainer.model.state_dict())
    Engine(partial(trainer.train_step, split="train")).run(trainer.dls["train"], max_epochs=1)
    assert _digest(trainer.model.state_dict()) != weights


def test_lr_find_prints_a_suggestion_and_writes_only_its_plot(tmp_path, capsys):
    save_dir = tmp_path / "run"
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(save_dir))
    assert main(["lr-find", f"--config={config}", "--num-iter", "30"]) == 0
    out = capsys.readouterr().out
    suggested = float(re.search(r"^suggested learning rate: (\S+)$", out, re.M).group(1))
    assert f"--override optimizer_params.lr={suggested:.3g}" in out
    assert 1e-7 <= suggested <= 10.0
    png = save_dir / "lr_find.png"
    assert f"loss-vs-lr plot written to {png}" in out
    # No checkpoint, no run.json, no log: the plot is all that is written.
    assert sorted(p.name for p in save_dir.iterdir()) == ["lr_find.png"]
    assert png.read_bytes().startswith(b"\x89PNG")
    assert imread(png).shape[:2] == (400, 600)


def test_the_plot_goes_where_out_says(tmp_path, capsys):
    save_dir = tmp_path / "run"
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(save_dir))
    png = tmp_path / "plots" / "lr.png"
    assert main(["lr-find", f"--config={config}", "--num-iter", "20", "--out", str(png)]) == 0
    assert png.is_file()
    assert not save_dir.exists()


@pytest.mark.parametrize("warm_start", [True, False])
def test_a_fine_tune_searches_from_the_weights_it_starts_from(tmp_path, monkeypatch, warm_start):
    torch.manual_seed(123)
    source = Model().state_dict()
    torch.save({"model": source}, tmp_path / "warm.pt")
    searched = []

    def record(trainer, *_range):
        searched.append(_digest(trainer.model.state_dict()))
        return LRSearch(
            lrs=[1e-3, 1e-2, 1e-1], losses=[1.0, 0.5, 2.0], suggestion=1e-2, diverged=True
        )

    monkeypatch.setattr(lr_find, "find_lr", record)
    fields = {"model_checkpoint_dir": str(tmp_path / "warm.pt")} if warm_start else {}
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **fields)
    assert main(["lr-find", f"--config={config}"]) == 0
    assert (searched == [_digest(source)]) is warm_start


@pytest.mark.parametrize(
    "flags, phrase",
    [
        (["--start-lr", "1", "--end-lr", "0.1"], "0 < --start-lr < --end-lr"),
        (["--num-iter", "2"], "--num-iter >= 3"),
    ],
)
def test_a_bad_range_is_a_config_error(tmp_path, capsys, flags, phrase):
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"))
    assert main(["lr-find", f"--config={config}", *flags]) == 2
    assert phrase in capsys.readouterr().err


def test_without_matplotlib_lr_find_names_the_extra(tmp_path, capsys, monkeypatch):
    for module in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, module, None)
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"))
    assert main(["lr-find", f"--config={config}"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "gatle-ignite[plot]"' in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_the_report_starts_at_the_start_lr_given_and_says_what_the_curve_did(tmp_path, capsys):
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"))
    flags = ["--start-lr", "1e-5", "--end-lr", "1", "--num-iter", "30"]
    assert main(["lr-find", f"--config={config}", *flags]) == 0
    first = re.search(r"^LR FIND: \d+ iterations, lr (\S+) to", capsys.readouterr().out, re.M)
    assert float(first.group(1)) == 1e-5


@pytest.mark.parametrize(
    "losses, diverged, told",
    [
        # The curve of the issue: a rise to 3.6 times the lowest, short of ignite's stop at 5.
        ([1.2, 1.03, 1.5, 3.75], False, "from 1.2 to 1.03 at lr 0.01, then rose to 3.75 at lr 1"),
        ([2.0, 1.5, 1.2, 9.0], True, "then blew up by lr 1"),
        ([2.0, 1.5, 1.2, 1.0], False, "still falling at the last lr, 1: a higher --end-lr"),
        ([1.0, 1.2, 1.5, 2.0], False, "never fell below its first value 1, and rose to 2"),
    ],
)
def test_the_report_tells_what_the_loss_did(losses, diverged, told):
    lrs = [1e-3, 1e-2, 1e-1, 1.0]
    search = LRSearch(lrs=lrs, losses=losses, suggestion=1e-2, diverged=diverged)
    story = lr_find.curve_story(search)
    assert told in story
    assert ("never diverged" in story) is False


def test_lr_find_help_says_what_it_writes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = " ".join(capsys.readouterr().out.split())
    assert "lr-find a learning-rate range test" in listed and "lr_find.png" in listed
