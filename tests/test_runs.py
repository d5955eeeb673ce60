"""``gatle-ignite runs``: many real runs side by side, the best first, as a table or as CSV."""

import csv
import io
import json
from pathlib import Path

import pytest

from gatle_ignite.cli.main import main
from gatle_ignite.run.layout import CONFIG_FILE, MANIFEST_FILE
from tests.toy.config import toy_config
from tests.toy.trainer import Trainer

LEARNING_RATES = (0.001, 0.1, 0.01)


def _train(save_dir, **fields) -> Path:
    Trainer(0, toy_config(save_dir=str(save_dir), **fields)).fit()
    return Path(save_dir)


def _lr_run(save_dir, lr) -> Path:
    return _train(save_dir, optimizer_params={"lr": lr, "weight_decay": 0.0})


def _manifest(save_dir) -> dict:
    return json.loads((Path(save_dir) / MANIFEST_FILE).read_text())


def _best_score(save_dir) -> float:
    bests = [e for e in _manifest(save_dir)["checkpoints"] if e["kind"] == "best"]
    return max(e["score"] for e in bests)


@pytest.fixture(scope="module")
def lr_runs(tmp_path_factory):
    """Three real runs differing only in lr, in a folder of their own, one of them nested."""
    folder = tmp_path_factory.mktemp("runs")
    for lr in LEARNING_RATES:
        _lr_run(folder / ("nested" if lr == 0.01 else "") / f"lr{lr}", lr)
    return folder


def _runs(capsys, *args, columns=200) -> tuple:
    capsys.readouterr()  # what training printed before
    with pytest.MonkeyPatch.context() as patch:
        # The terminal's width, as shutil.get_terminal_size reads it.
        patch.setenv("COLUMNS", str(columns))
        code = main(["runs", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _table(out: str) -> list:
    """The table's lines split into cells, header first (the summary line left out)."""
    return [line.split() for line in out.splitlines()[1:]]


def _csv(out: str) -> list:
    return list(csv.DictReader(io.StringIO(out)))


def test_a_folder_of_runs_is_one_line_each_best_score_first(lr_runs, capsys):
    code, out, _err = _runs(capsys, lr_runs)
    assert code == 0
    assert out.splitlines()[0] == "3 run(s) scored by valid/acc (higher is better), the best first"
    header, *lines = _table(out)
    # The score column is headed by its metric; a differing field by its short name.
    assert header == ["run", "state", "valid/acc", "epoch", "epochs", "time", "lr"]
    by_name = {"lr0.001": "lr0.001", "lr0.1": "lr0.1", "lr0.01": "nested/lr0.01"}
    paths = [lr_runs / by_name[line[0]] for line in lines]
    scores = [_best_score(path) for path in paths]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 3
    for line, path in zip(lines, paths):
        name, state, score, _epoch, epochs, _time, lr = line
        # Every run is named toy: the directory tells them apart.
        assert (name, state, epochs) == (path.name, "completed", "2/2")
        assert float(score) == pytest.approx(_best_score(path), abs=1e-4)
        assert float(lr) == _manifest(path)["config"]["optimizer_params"]["lr"]


def test_csv_has_the_run_state_score_and_one_column_per_differing_parameter(lr_runs, capsys):
    code, out, _err = _runs(capsys, "--csv", lr_runs)
    assert code == 0
    rows = _csv(out)
    columns = list(rows[0])
    assert columns[:3] == ["run", "state", "score"]
    assert "optimizer_params.lr" in columns
    # What names or stores a run is not a parameter; what is the same in every run neither.
    assert not {"save_dir", "name", "seed", "optimizer_params.weight_decay"} & set(columns)
    by_lr = {float(row["optimizer_params.lr"]): row for row in rows}
    assert set(by_lr) == set(LEARNING_RATES)
    for row in by_lr.values():
        assert float(row["score"]) == _best_score(row["path"])
        assert (row["epochs"], row["max_epochs"], row["state"]) == ("2", "2", "completed")
        assert float(row["seconds"]) >= 0
    assert [float(row["score"]) for row in rows] == sorted(
        (float(row["score"]) for row in rows), reverse=True
    )


def test_run_directories_named_one_by_one_are_compared_the_same(lr_runs, capsys):
    named = [lr_runs / "lr0.1", lr_runs / "nested" / "lr0.01"]
    rows = _csv(_runs(capsys, "--csv", *named)[1])
    assert [Path(row["path"]) for row in rows] == named
    assert "optimizer_params.lr" in rows[0]


def test_a_lower_is_better_score_ranks_the_lowest_first(tmp_path, capsys):
    for lr in (0.1, 0.001):
        # -acc: lower is better, so the run with the highest accuracy still comes first.
        _train(
            tmp_path / f"lr{lr}",
            optimizer_params={"lr": lr, "weight_decay": 0.0},
            score_factor=-1,
        )
    rows = _csv(_runs(capsys, "--csv", tmp_path)[1])
    scores = [float(row["score"]) for row in rows]
    assert scores == sorted(scores) and len(set(scores)) == 2
    assert scores[0] == -_best_score(rows[0]["path"])


def test_runs_without_provenance_or_run_json_still_show(lr_runs, tmp_path, capsys):
    """A run.json from before provenance was recorded, and a 0.4 directory with none."""
    earlier = _lr_run(tmp_path / "earlier", 0.1)
    manifest = _manifest(earlier)
    del manifest["provenance"]
    manifest.update(created="2026-01-01T10:00:00+00:00", updated="2026-01-01T10:02:05+00:00")
    (earlier / MANIFEST_FILE).write_text(json.dumps(manifest))
    old = _lr_run(tmp_path / "old", 0.001)
    (old / MANIFEST_FILE).unlink()
    code, out, _err = _runs(capsys, earlier, old)
    assert code == 0
    _header, *lines = _table(out)
    by_name = {line[0]: line for line in lines}
    assert by_name["earlier"][:6] == [
        "earlier",
        "completed",
        f"{_best_score(earlier):.5g}",
        by_name["earlier"][3],
        "2/2",
        "2m05s",
    ]
    # No manifest: the state is unknown, the best score comes from the file name, the config
    # from config.json.
    assert (old / CONFIG_FILE).is_file()
    name, state, score, epoch, epochs, time, lr = by_name["old"]
    assert (state, epochs, time, lr) == ("unknown", "2/2", "-", "0.001")
    assert float(score) == pytest.approx(_best_score(lr_runs / "lr0.001"), abs=1e-4)


def test_a_sweeps_trials_show_their_number_their_parameters_and_pruned(tmp_path, capsys):
    """What a sweep records in a trial's run.json: its trial, its parameters, pruned."""
    for number, lr in enumerate((0.1, 0.01)):
        trial = _lr_run(tmp_path / "sweep" / f"trial_{number}", lr)
        manifest = _manifest(trial)
        params = {"optimizer_params.lr": lr, "seed": 42}
        sweep = {"sweep_dir": str(tmp_path / "sweep"), "study": "lr_sweep", "trial": number}
        manifest.update(sweep={**sweep, "params": params})
        manifest.update(state="pruned" if number else "completed")
        (trial / MANIFEST_FILE).write_text(json.dumps(manifest))
    rows = _csv(_runs(capsys, "--csv", tmp_path / "sweep")[1])
    # A trial is named with its sweep (the study), so two sweeps' trials differ.
    assert [(row["run"], row["state"]) for row in rows] == [
        ("lr_sweep/trial 0", "completed"),
        ("lr_sweep/trial 1", "pruned"),
    ]
    # A swept parameter is a column even where every trial has the same value.
    assert (rows[0]["optimizer_params.lr"], rows[0]["seed"]) == ("0.1", "42")


def test_a_run_left_running_by_a_dead_process_is_interrupted(tmp_path, capsys):
    run = _lr_run(tmp_path / "killed", 0.1)
    manifest = _manifest(run)
    manifest["state"] = "running"
    (run / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert _csv(_runs(capsys, "--csv", run)[1])[0]["state"] == "interrupted"


def test_provenance_columns_say_how_each_run_was_made(lr_runs, capsys):
    rows = _csv(_runs(capsys, "--csv", "--provenance", lr_runs)[1])
    start = _manifest(rows[0]["path"])["provenance"][0]
    for column in ("python", "torch", "ignite", "gatle_ignite"):
        assert rows[0][column] == start["versions"][column]
    assert (rows[0]["host"], rows[0]["world_size"]) == (start["host"], "1")
    assert rows[0]["command"]
    assert list(rows[0])[-1] == "path"


def test_a_directory_without_runs_is_a_config_error(tmp_path, capsys):
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    code, _out, err = _runs(capsys, tmp_path / "empty")
    assert code == 2
    assert err.startswith(f"\nconfig error: no run in {tmp_path / 'empty'}")
    code, _out, err = _runs(capsys, tmp_path / "missing")
    assert code == 2 and "is not a directory" in err and "Traceback" not in err


# ---- comparable runs, the fields that set them apart, the terminal's width ----

ACC_LOWER = {"score_factor": -1}
TWO_TERMS = {
    "dict_of_loss_params": {
        "ce": {"cls_name": "tests.toy.loss", "weight": 1.0},
        "aux": {"cls_name": "tests.toy.loss", "weight": 0.5},
    }
}


@pytest.fixture(scope="module")
def mixed_runs(tmp_path_factory):
    """Runs that differ in lr, model, loss terms and score direction, in one folder."""
    folder = tmp_path_factory.mktemp("mixed")
    plain = {"weight_decay": 0.0}
    _train(folder / "a", optimizer_params={"lr": 0.1, **plain})
    _train(
        folder / "b",
        optimizer_params={"lr": 0.01, **plain},
        model_name="tests.toy.norm_model",
        criterion_params=TWO_TERMS,
    )
    _train(folder / "c", optimizer_params={"lr": 0.001, **plain}, model_name="tests.toy.norm_model")
    _train(folder / "lower1", optimizer_params={"lr": 0.1, **plain}, **ACC_LOWER)
    _train(folder / "lower2", optimizer_params={"lr": 0.01, **plain}, **ACC_LOWER)
    return folder


def _parts(out: str) -> list:
    """The tables of the output, each as its title and its lines split into cells."""
    return [
        (part.splitlines()[0], [line.split() for line in part.splitlines()[1:]])
        for part in out.strip("\n").split("\n\n")
    ]


def test_runs_of_another_score_direction_are_ranked_apart(mixed_runs, capsys):
    code, out, _err = _runs(capsys, mixed_runs)
    assert code == 0
    (higher, higher_rows), (lower, lower_rows) = _parts(out)
    assert higher == "3 run(s) scored by valid/acc (higher is better), the best first"
    assert lower == "2 run(s) scored by valid/acc (lower is better), the best first"
    assert sorted(row[0] for row in higher_rows[1:]) == ["a", "b", "c"]
    assert sorted(row[0] for row in lower_rows[1:]) == ["lower1", "lower2"]
    higher_scores = [float(row[2]) for row in higher_rows[1:]]
    lower_scores = [float(row[2]) for row in lower_rows[1:]]
    assert higher_scores == sorted(higher_scores, reverse=True)
    assert lower_scores == sorted(lower_scores)
    # The CSV keeps one row per run and its columns, in the tables' order.
    rows = _csv(_runs(capsys, "--csv", mixed_runs)[1])
    assert [row["run"] for row in rows] == [row[0] for row in higher_rows[1:] + lower_rows[1:]]
    assert list(rows[0])[:7] == [
        "run",
        "state",
        "score",
        "epoch",
        "epochs",
        "max_epochs",
        "seconds",
    ]
    assert "criterion_params.dict_of_loss_params.aux.cls_name" in rows[0]


def test_the_table_shows_the_few_fields_that_differ_by_short_names(mixed_runs, capsys):
    (_title, lines), _lower = _parts(_runs(capsys, mixed_runs)[1])
    header, *rows = lines
    # lr and the model differ in every run; a loss term only one run has is left to --all,
    # the score direction is the table's own, and a module path shows its last part.
    assert header == ["run", "state", "valid/acc", "epoch", "epochs", "time", "lr", "model"]
    models = {row[0]: row[-1] for row in rows}
    assert models == {"a": "model", "b": "norm_model", "c": "norm_model"}
    everything = _parts(_runs(capsys, "--all", mixed_runs)[1])[0][1][0]
    assert everything[6:] == [
        "criterion_params.dict_of_loss_params.aux.cls_name",
        "criterion_params.dict_of_loss_params.aux.weight",
        "model_name",
        "optimizer_params.lr",
        "path",
    ]


def test_the_table_fits_the_terminal_and_counts_what_it_leaves_out(mixed_runs, capsys):
    wide = _runs(capsys, mixed_runs)[1].splitlines()
    width = max(len(line) for line in wide[1:5])
    narrow = _runs(capsys, mixed_runs, columns=width - 1)[1].splitlines()
    # The model column does not fit: it goes, and a line says how to see it.
    assert narrow[1].split()[-1] == "lr"
    assert narrow[5] == "+1 more column(s): --all shows every differing field"
    assert all(len(line) < width for line in narrow[1:5])
    # --all shows every field whatever the width.
    assert "path" in _runs(capsys, "--all", mixed_runs, columns=40)[1].splitlines()[1].split()


def test_two_sweeps_trials_of_one_number_are_told_apart(tmp_path, capsys):
    for sweep, study in (("first", "lr_a"), ("second", "lr_b"), ("third", "lr_b")):
        trial = _lr_run(tmp_path / sweep / "trial_1", 0.1)
        manifest = _manifest(trial)
        record = {"sweep_dir": str(tmp_path / sweep), "study": study, "trial": 1}
        manifest.update(sweep={**record, "params": {"optimizer_params.lr": 0.1}})
        (trial / MANIFEST_FILE).write_text(json.dumps(manifest))
    rows = _csv(_runs(capsys, "--csv", tmp_path)[1])
    # Named with its sweep; where two sweeps share a study name, by its path.
    assert sorted(row["run"] for row in rows) == ["lr_a/trial 1", "second/trial_1", "third/trial_1"]
    table = _runs(capsys, tmp_path)[1].splitlines()
    assert sorted(line.split("  ")[0] for line in table[2:]) == [
        "lr_a/trial 1",
        "second/trial_1",
        "third/trial_1",
    ]
