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
    (1.3, 1, 4, "valid/loss", 0.6),
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
    # Evaluation metrics first, then the training loss, then the learning rates.
    assert [ax.get_title() for ax in figure.axes] == ["valid/acc", "train/loss_avg", "train/lr"]
    image = imread(out)
    # Three panels in one row of 4.5 x 3.2 inches at 100 dpi, RGBA.
    assert image.shape == (320, 1350, 4)


def test_a_run_with_more_metrics_gets_more_panels(epoch_run, step_run, tmp_path):
    fewer = plot_runs([epoch_run], tmp_path / "fewer.png")
    more = plot_runs([step_run], tmp_path / "more.png")
    # The list-valued confusion matrix has no curve and no panel.
    assert [ax.get_title() for ax in more.axes] == [
        "valid/acc",
        "valid/loss",
        "train/loss_avg",
        "train/lr",
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
    assert _lines(_panel(figure, "valid/loss")) == {"step_run": [4, 8]}


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
    figure = plot_runs([save_dir], tmp_path / "toy.png", perf=True)
    assert "valid/acc" in names and "train/lr_0" in names and "train/loss_ce_avg" in names
    # The score leads and says which way is better; the toy's one loss term is the total
    # again: one panel for both, named so. Its learning rate is constant: no panel.
    assert [ax.get_title() for ax in figure.axes] == [
        "valid/acc (score, higher is better)",
        "train/loss",
        "train/loss_avg = train/loss_ce_avg",
    ]
    assert figure.get_suptitle() == "Constant over the run: train/lr = 0.01"
    # The perf/ metrics: a figure of their own, FLOPs per step (logged once) named, not drawn.
    perf = [name for name in names if name.startswith("perf/")]
    drawn = imread(tmp_path / "toy_perf.png")
    assert drawn.shape[1] == 1350 and len(perf) >= 8
    assert "perf/flops_per_step" in perf


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
    optimizer["lr_scheduler"] = "gatle_ignite.schedulers.cosine"
    Trainer(0, toy_config(save_dir=str(save_dir), logger_name=["csv"], **optimizer)).fit()
    assert json.loads((save_dir / "run.json").read_text())["lr_groups"] == ["decay", "no_decay"]
    figure = plot_runs([save_dir], tmp_path / "named.png")
    [ax] = [ax for ax in figure.axes if ax.get_title() == "train/lr"]
    assert set(_lines(ax)) == {"decay", "no_decay"}


def test_a_metric_equal_to_another_in_only_one_run_keeps_its_panel(tmp_path):
    same = [
        (1.0, 1, s, name, 1 / s) for s in (4, 8) for name in ("train/loss_avg", "train/loss_ce_avg")
    ]
    differs = [(1.0, 1, s, "train/loss_avg", 1 / s) for s in (4, 8)]
    differs += [(1.0, 1, s, "train/loss_ce_avg", 0.5 / s) for s in (4, 8)]
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
    score = _panel(figure, "valid/acc (score, higher is better)")
    assert set(_lines(score)) == {"lr0.1", "lr0.01", "lr0.001"}


def test_best_k_draws_only_the_highest_scoring_runs_best_first(folder_of_runs, tmp_path, capsys):
    folder, runs = folder_of_runs
    ranked = sorted(runs, key=runs.get, reverse=True)
    assert runs_to_draw([str(folder)], best=2)[0] == ranked[:2]
    out = tmp_path / "best.png"
    assert main(["plot", str(folder), "--best", "2", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"of the best 2 run(s) written to {out}")
    assert lines[1].endswith("perf/ panel(s), which --perf draws apart")
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
    assert lines[2] == f"STUDY: {', '.join(map(str, studies))}"
    for path in (out, *studies):
        assert imread(path).shape[2] == 4
    paths, labels = runs_to_draw([str(sweep)])
    # A trial is named with its sweep (its study).
    assert labels == [f"toy_lr/trial {n}" for n in range(4)]


def test_without_optuna_a_sweeps_plot_names_the_extra(sweep, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    out = tmp_path / "sweep.png"
    assert main(["plot", str(sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert 'pip install "gatle-ignite[sweep]"' in err and "Traceback" not in err
    assert not out.exists()


# ---- what leads, what is chosen, which axis ----


def _train_bs(save_dir, bs, **fields):
    data = {"train_ds_name": "tests.toy.perf_data"}
    data["train_ds_params"] = {"n": 64, "bs": bs, "shuffle": True, "seed": 0, **fields}
    Trainer(0, toy_config(save_dir=str(save_dir), max_epochs=2, log_every=1, **data)).fit()
    return save_dir


@pytest.fixture(scope="module")
def batch_sizes(tmp_path_factory):
    """Two real runs over the same 64 samples an epoch, in batches of 8 and of 32; the first
    says how many tokens a sample holds."""
    folder = tmp_path_factory.mktemp("batches")
    return _train_bs(folder / "bs8", 8, tokens_per_sample=10), _train_bs(folder / "bs32", 32)


def test_a_score_that_is_lower_when_better_says_so_first(tmp_path):
    save_dir = tmp_path / "lower"
    Trainer(0, toy_config(save_dir=str(save_dir), score_factor=-1)).fit()
    figure = plot_runs([save_dir], tmp_path / "lower.png")
    assert figure.axes[0].get_title() == "valid/acc (score, lower is better)"


def test_metrics_patterns_choose_the_panels(epoch_run, step_run, tmp_path, capsys):
    figure = plot_runs([epoch_run, step_run], tmp_path / "some.png", metrics=["valid/*"])
    assert [ax.get_title() for ax in figure.axes] == ["valid/acc", "valid/loss"]
    # A learning-rate panel answers to its own title and to its groups' names.
    figure = plot_runs([step_run], tmp_path / "lr.png", metrics=["train/lr", "*loss_avg"])
    assert [ax.get_title() for ax in figure.axes] == ["train/loss_avg", "train/lr"]
    out = tmp_path / "never.png"
    assert main(["plot", str(step_run), "--out", str(out), "--metrics", "valid/ppl"]) == 2
    err = capsys.readouterr().err
    assert "--metrics 'valid/ppl' matches no metric of these runs" in err
    assert "train/loss_avg, train/lr, train/lr_0, valid/acc, valid/loss" in err
    assert not out.exists()


def test_a_perf_metric_chosen_by_name_is_drawn_with_the_rest(batch_sizes, tmp_path):
    bs8, _bs32 = batch_sizes
    figure = plot_runs([bs8], tmp_path / "perf.png", metrics=["valid/acc", "perf/samples_per_s"])
    assert [ax.get_title() for ax in figure.axes] == [
        "valid/acc (score, higher is better)",
        "perf/samples_per_s",
    ]


def test_the_perf_option_writes_the_perf_panels_beside_the_figure(batch_sizes, tmp_path, capsys):
    bs8, _bs32 = batch_sizes
    out = tmp_path / "run.png"
    assert main(["plot", str(bs8), "--out", str(out), "--perf"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("PERF: ") and lines[1].endswith(
        f"written to {tmp_path}/run_perf.png"
    )
    assert imread(tmp_path / "run_perf.png").shape[2] == 4


def test_samples_put_runs_of_other_batch_sizes_on_one_axis(batch_sizes, tmp_path):
    bs8, bs32 = batch_sizes
    by_iteration = plot_runs([bs8, bs32], tmp_path / "it.png")
    score = "valid/acc (score, higher is better)"
    # Each epoch ends at the 8th iteration of one run and the 2nd of the other...
    assert _lines(_panel(by_iteration, score)) == {"bs8": [8, 16], "bs32": [2, 4]}
    # ... and after the same 64 samples of both.
    by_samples = plot_runs([bs8, bs32], tmp_path / "samples.png", x="samples")
    acc = _panel(by_samples, score)
    assert _lines(acc) == {"bs8": [64, 128], "bs32": [64, 128]}
    assert acc.get_xlabel() == "samples seen"
    loss = _lines(_panel(by_samples, "train/loss"))
    assert loss["bs8"] == [8 * i for i in range(1, 17)] and loss["bs32"] == [32, 64, 96, 128]
    by_epoch = plot_runs([bs8, bs32], tmp_path / "epoch.png", x="epoch")
    assert _lines(_panel(by_epoch, score)) == {"bs8": [1, 2], "bs32": [1, 2]}
    assert _lines(_panel(by_epoch, "train/loss"))["bs32"] == [0.5, 1, 1.5, 2]


def test_samples_come_from_the_perf_rows_where_the_config_has_no_batch_size(batch_sizes, tmp_path):
    bs8, _bs32 = batch_sizes
    copied = tmp_path / "no_bs"
    copied.mkdir()
    (copied / "metrics.csv").write_bytes((bs8 / "metrics.csv").read_bytes())
    manifest = json.loads((bs8 / "run.json").read_text())
    del manifest["config"]["train_ds_params"]["bs"]
    (copied / "run.json").write_text(json.dumps(manifest))
    figure = plot_runs([copied], tmp_path / "perf_rows.png", x="samples")
    [xs] = _lines(_panel(figure, "valid/acc (score, higher is better)")).values()
    assert xs == pytest.approx([64, 128])


def test_tokens_only_for_runs_that_recorded_them(batch_sizes, tmp_path, capsys):
    bs8, bs32 = batch_sizes
    with pytest.warns(UserWarning, match="bs32 recorded no tokens"):
        figure = plot_runs([bs8, bs32], tmp_path / "tokens.png", x="tokens")
    acc = _panel(figure, "valid/acc (score, higher is better)")
    # 10 tokens a sample, 64 samples an epoch.
    assert _lines(acc) == {"bs8": pytest.approx([640, 1280])}
    assert acc.get_xlabel() == "tokens seen"
    out = tmp_path / "never.png"
    assert main(["plot", str(bs32), "--out", str(out), "--x", "tokens"]) == 2
    err = capsys.readouterr().err
    assert "--x tokens: none of these runs recorded tokens" in err
    assert "tokens_per_sample" in err and not out.exists()


def test_best_k_refuses_to_rank_runs_of_other_scores(folder_of_runs, tmp_path, capsys):
    folder, _runs = folder_of_runs
    lower = tmp_path / "lower"
    Trainer(0, toy_config(save_dir=str(lower), score_factor=-1)).fit()
    capsys.readouterr()
    out = tmp_path / "never.png"
    assert main(["plot", str(folder), str(lower), "--best", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "scored by different metrics or directions" in err
    assert "3 by valid/acc (higher is better); 1 by valid/acc (lower is better)" in err
