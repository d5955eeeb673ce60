"""``gatle-ignite plot``: one panel per metric, runs overlaid, from each run's metrics.csv; a
folder or a sweep stands for the runs below it, and a sweep's study gets Optuna's plots."""

import csv
import json
import sys

import pytest
from matplotlib.image import imread

from gatle_ignite.cli.main import main
from gatle_ignite.cli.plot import plot_runs, runs_to_draw
from gatle_ignite.dispatch import ConfigError
from tests.toy.config import toy_config
from tests.toy.trainer import Trainer

HEADER = ("wall_time", "epoch", "step", "name", "value")
# Today's rows: epoch metrics carry no step.
EPOCH_ROWS = [
    (1.0, 1, 2, "train/lr_0", 0.01),
    (1.1, 1, 4, "train/lr_0", 0.02),
    (1.2, 1, "", "train/loss_avg", 1.1),
    (1.3, 1, "", "valid/acc", 0.4),
    (2.0, 2, 6, "train/lr_0", 0.03),
    (2.1, 2, 8, "train/lr_0", 0.04),
    (2.2, 2, "", "train/loss_avg", 0.9),
    (2.3, 2, "", "valid/acc", 0.6),
]
# The rows to come: every one carries the global iteration and the epoch.
STEP_ROWS = [
    (1.0, 1, 4, "train/lr_0", 0.02),
    (1.2, 1, 4, "train/loss_avg", 1.0),
    (1.3, 1, 4, "valid/acc", 0.5),
    (1.3, 1, 4, "valid/confusion", "[[1, 0], [0, 1]]"),
    (2.0, 2, 8, "train/lr_0", 0.04),
    (2.2, 2, 8, "train/loss_avg", 0.8),
    (2.3, 2, 8, "valid/acc", 0.7),
    (2.3, 2, 8, "valid/loss", 0.5),
]


def _run_dir(path, rows):
    path.mkdir(parents=True)
    with open(path / "metrics.csv", "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([HEADER, *rows])
    return path


@pytest.fixture
def epoch_run(tmp_path):
    return _run_dir(tmp_path / "epoch_run", EPOCH_ROWS)


@pytest.fixture
def step_run(tmp_path):
    return _run_dir(tmp_path / "step_run", STEP_ROWS)


def _panel(figure, title):
    [ax] = [ax for ax in figure.axes if ax.get_title() == title]
    return ax


def _lines(ax):
    return {line.get_label(): list(line.get_xdata()) for line in ax.get_lines()}


def test_one_panel_per_metric_in_a_valid_png(epoch_run, tmp_path):
    out = tmp_path / "curves.png"
    figure = plot_runs([epoch_run], out)
    assert [ax.get_title() for ax in figure.axes] == ["train/loss_avg", "train/lr", "valid/acc"]
    image = imread(out)
    # Three panels in one row of 4.5 x 3.2 inches at 100 dpi, RGBA.
    assert image.shape == (320, 1350, 4)


def test_a_run_with_more_metrics_gets_more_panels(epoch_run, step_run, tmp_path):
    fewer = plot_runs([epoch_run], tmp_path / "fewer.png")
    more = plot_runs([step_run], tmp_path / "more.png")
    # The list-valued confusion matrix has no curve and no panel.
    assert [ax.get_title() for ax in more.axes] == [
        "train/loss_avg",
        "train/lr",
        "valid/acc",
        "valid/loss",
    ]
    assert len(more.axes) == len(fewer.axes) + 1
    assert imread(tmp_path / "more.png").shape == (640, 1350, 4)


def test_runs_are_overlaid_under_their_directory_names(epoch_run, step_run, tmp_path):
    figure = plot_runs([epoch_run, step_run], tmp_path / "both.png")
    assert len(figure.axes) == 4
    lr = _panel(figure, "train/lr")
    assert _lines(lr) == {"epoch_run": [2, 4, 6, 8], "step_run": [4, 8]}
    assert lr.get_xlabel() == "iteration"
    # One colour per run, in every panel.
    colours = {line.get_label(): line.get_color() for line in lr.get_lines()}
    loss = _panel(figure, "train/loss_avg")
    assert {line.get_label(): line.get_color() for line in loss.get_lines()} == colours
    assert _lines(_panel(figure, "valid/loss")) == {"step_run": [8]}


def test_epoch_metrics_without_a_step_fall_back_to_the_epoch(epoch_run, step_run, tmp_path):
    alone = plot_runs([step_run], tmp_path / "steps.png")
    acc = _panel(alone, "valid/acc")
    assert (_lines(acc), acc.get_xlabel()) == ({"step_run": [4, 8]}, "iteration")
    mixed = plot_runs([epoch_run, step_run], tmp_path / "mixed.png")
    acc = _panel(mixed, "valid/acc")
    # One x unit per panel: a run without steps puts the whole panel on epochs.
    assert _lines(acc) == {"epoch_run": [1, 2], "step_run": [1, 2]}
    assert acc.get_xlabel() == "epoch (no step recorded)"


def test_a_trained_run_gets_a_panel_per_logged_metric(tmp_path):
    save_dir = tmp_path / "toy"
    Trainer(0, toy_config(save_dir=str(save_dir), logger_name=["csv"], log_every=2)).fit()
    with open(save_dir / "metrics.csv", newline="", encoding="utf-8") as handle:
        names = sorted({row["name"] for row in csv.DictReader(handle)})
    figure = plot_runs([save_dir], tmp_path / "toy.png")
    assert "valid/acc" in names and "train/lr_0" in names and "train/loss_ce_avg" in names
    # The toy's one loss term is the total again: one panel for both, named so.
    merged = {"train/loss_avg": "train/loss_avg = train/loss_ce_avg", "train/lr_0": "train/lr"}
    shown = [merged.get(name, name) for name in names if name != "train/loss_ce_avg"]
    assert [ax.get_title() for ax in figure.axes] == shown


def test_param_groups_share_one_lr_panel_a_line_each(tmp_path):
    rows = [(1.0, 1, i, f"train/lr_{g}", 0.1 * i * (g + 1)) for i in (1, 2) for g in (0, 1)]
    run = _run_dir(tmp_path / "grouped", rows)
    figure = plot_runs([run], tmp_path / "grouped.png")
    assert [ax.get_title() for ax in figure.axes] == ["train/lr"]
    [ax] = figure.axes
    assert _lines(ax) == {"param group 0": [1, 2], "param group 1": [1, 2]}
    assert [line.get_linestyle() for line in ax.get_lines()] == ["-", "--"]


def test_a_real_runs_lr_lines_are_named_after_its_param_groups(tmp_path):
    # The built-in adamw splits decay from no-decay parameters and names the two groups.
    save_dir = tmp_path / "named"
    optimizer = {"optimizer_name": "gatle_ignite.optimizers.adamw"}
    optimizer["optimizer_params"] = {"lr": 1e-2, "weight_decay": 0.1}
    Trainer(0, toy_config(save_dir=str(save_dir), logger_name=["csv"], **optimizer)).fit()
    assert json.loads((save_dir / "run.json").read_text())["lr_groups"] == ["decay", "no_decay"]
    figure = plot_runs([save_dir], tmp_path / "named.png")
    [ax] = [ax for ax in figure.axes if ax.get_title() == "train/lr"]
    assert set(_lines(ax)) == {"decay", "no_decay"}


def test_a_metric_equal_to_another_in_only_one_run_keeps_its_panel(tmp_path):
    same = [(1.0, 1, 4, "train/loss_avg", 0.5), (1.0, 1, 4, "train/loss_ce_avg", 0.5)]
    differs = [(1.0, 1, 4, "train/loss_avg", 0.5), (1.0, 1, 4, "train/loss_ce_avg", 0.25)]
    one = _run_dir(tmp_path / "same", same)
    assert [ax.get_title() for ax in plot_runs([one], tmp_path / "a.png").axes] == [
        "train/loss_avg = train/loss_ce_avg"
    ]
    other = _run_dir(tmp_path / "differs", differs)
    figure = plot_runs([one, other], tmp_path / "b.png")
    assert [ax.get_title() for ax in figure.axes] == ["train/loss_avg", "train/loss_ce_avg"]


def test_the_command_writes_the_png_and_says_where(epoch_run, step_run, tmp_path, capsys):
    out = tmp_path / "plots" / "compare.png"
    assert main(["plot", str(epoch_run), str(step_run), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"PLOT: 4 metric panel(s) of 2 run(s) written to {out}\n"
    assert out.read_bytes().startswith(b"\x89PNG")


def test_a_run_without_metrics_csv_is_a_config_error(epoch_run, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    out = tmp_path / "never.png"
    assert main(["plot", str(epoch_run), str(bare), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"\nconfig error: {bare} has no metrics.csv.")
    # Every training run writes metrics.csv: no logger setting is the remedy.
    assert "every run writes its metrics.csv" in err
    assert "logger_name" not in err and "Traceback" not in err
    assert not out.exists()


def test_a_path_that_does_not_exist_is_a_config_error(epoch_run, tmp_path, capsys):
    missing = tmp_path / "missing"
    out = tmp_path / "never.png"
    assert main(["plot", str(epoch_run), str(missing), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"\nconfig error: {missing} does not exist.")
    assert "metrics.csv" not in err and "Traceback" not in err
    assert not out.exists()


def test_a_file_that_is_not_a_history_is_refused(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "metrics.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="needs the columns epoch, step, name, value"):
        plot_runs([folder], tmp_path / "never.png")


def test_without_matplotlib_plot_names_the_extra(epoch_run, tmp_path, capsys, monkeypatch):
    for module in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, module, None)
    assert main(["plot", str(epoch_run), "--out", str(tmp_path / "never.png")]) == 2
    err = capsys.readouterr().err
    assert 'pip install "gatle-ignite[plot]"' in err and "Traceback" not in err


# ---- many runs: a folder of runs, the best k, a sweep and its study ----


def _train_lr(save_dir, lr):
    Trainer(0, toy_config(save_dir=str(save_dir), optimizer_params={"lr": lr})).fit()
    manifest = json.loads((save_dir / "run.json").read_text())
    return max(e["score"] for e in manifest["checkpoints"] if e["kind"] == "best")


@pytest.fixture(scope="module")
def folder_of_runs(tmp_path_factory):
    """Real runs of three learning rates, one nested deeper; ``{directory: best score}``."""
    folder = tmp_path_factory.mktemp("folder")
    runs = {}
    for lr, where in ((0.1, "lr0.1"), (0.01, "more/lr0.01"), (0.001, "lr0.001")):
        runs[folder / where] = _train_lr(folder / where, lr)
    return folder, runs


def test_a_folder_stands_for_every_run_below_it(folder_of_runs, tmp_path):
    folder, runs = folder_of_runs
    paths, labels = runs_to_draw([str(folder)])
    assert sorted(paths) == sorted(runs)
    figure = plot_runs(paths, tmp_path / "folder.png", labels)
    assert set(_lines(_panel(figure, "valid/acc"))) == {"lr0.1", "lr0.01", "lr0.001"}


def test_best_k_draws_only_the_highest_scoring_runs_best_first(folder_of_runs, tmp_path, capsys):
    folder, runs = folder_of_runs
    ranked = sorted(runs, key=runs.get, reverse=True)
    assert runs_to_draw([str(folder)], best=2)[0] == ranked[:2]
    out = tmp_path / "best.png"
    assert main(["plot", str(folder), "--best", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.endswith(f"of the best 2 run(s) written to {out}\n")
    assert out.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(SystemExit) as refused:
        main(["plot", str(folder), "--best", "0", "--out", str(out)])
    assert refused.value.code == 2 and "is not a positive whole number" in capsys.readouterr().err


def _sweep_record(folder, study):
    from gatle_ignite.sweep.record import SweepRecord

    fields = {"study": study, "storage": str(folder / "study.journal"), "config": "toy.py"}
    fields.update(config_fingerprint="0", overrides=[], params={}, metric="valid/acc")
    fields.update(direction="maximize", trials=4, sampler="tpe", pruner="none")
    SweepRecord.new(**fields).write(folder)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep directory as `gatle-ignite sweep` leaves it: an Optuna journal, sweep.json, and
    one real run per trial whose run.json names its trial and parameters."""
    optuna = pytest.importorskip("optuna")
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder = tmp_path_factory.mktemp("sweep")
    _sweep_record(folder, "toy_lr")
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(folder / "study.journal")))
    study = optuna.create_study(study_name="toy_lr", storage=storage, direction="maximize")
    for _ in range(4):
        trial = study.ask()
        lr = trial.suggest_float("optimizer_params.lr", 1e-3, 1e-1, log=True)
        run = folder / "trials" / f"{trial.number:03d}"
        score = _train_lr(run, lr)
        manifest = json.loads((run / "run.json").read_text())
        params = {"optimizer_params.lr": lr}
        manifest["sweep"] = {"sweep_dir": str(folder), "study": "toy_lr", "trial": trial.number}
        manifest["sweep"]["params"] = params
        (run / "run.json").write_text(json.dumps(manifest))
        study.tell(trial, score)
    return folder


def test_a_sweep_overlays_its_trials_and_writes_its_studys_plots(sweep, tmp_path, capsys):
    out = tmp_path / "sweep.png"
    assert main(["plot", str(sweep), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"of 4 run(s) written to {out}")
    studies = [tmp_path / f"sweep_{kind}.png" for kind in ("history", "importance", "parallel")]
    assert lines[1] == f"STUDY: {', '.join(map(str, studies))}"
    for path in (out, *studies):
        assert imread(path).shape[2] == 4
    paths, labels = runs_to_draw([str(sweep)])
    assert labels == [f"trial {n}" for n in range(4)]


def test_without_optuna_a_sweeps_plot_names_the_extra(sweep, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    out = tmp_path / "sweep.png"
    assert main(["plot", str(sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert 'pip install "gatle-ignite[sweep]"' in err and "Traceback" not in err
    assert not out.exists()
