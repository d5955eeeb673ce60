"""A lower-is-better score, said as ``score_factor=-1`` (0.4) or ``score_mode="min"``: the best
files keep 0.4's names, and every place that shows the score shows the metric's own value and
says "lower is better"."""

import contextlib
import io
import re
from pathlib import Path

import pytest

from gatle_ignite.cli.main import main
from gatle_ignite.cli.plot import plot_runs
from gatle_ignite.config.validate import validate_config
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.specs import EngineSpec
from tests.toy.config import toy_config
from tests.toy.config_file import write_toy_config

LOSS_METRIC = {"loss": {"cls_name": "gatle_ignite.metrics.loss", "params": {"tgt_name": "labels"}}}
LOWER = {"val_metrics": LOSS_METRIC, "score_name": "valid/loss", "max_epochs": 3}


def _train(capsys, tmp_path, name, **fields) -> tuple:
    save_dir = tmp_path / name
    config = write_toy_config(tmp_path / f"{name}.py", save_dir=str(save_dir), **fields)
    capsys.readouterr()
    assert main(["train", f"--config={config}"]) == 0
    return save_dir, capsys.readouterr().out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same lower-is-better run said both ways, and what its training printed."""
    folder = tmp_path_factory.mktemp("direction")
    done = {}
    for name, said in (("factor", {"score_factor": -1}), ("mode", {"score_mode": "min"})):
        save_dir = folder / name
        config = write_toy_config(folder / f"{name}.py", save_dir=str(save_dir), **LOWER, **said)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["train", f"--config={config}"]) == 0
        done[name] = (save_dir, out.getvalue())
    return done


def _best_files(save_dir: Path) -> list:
    return sorted(p.name for p in save_dir.glob("valid_best_result_checkpoint_*.pt"))


def _logged_losses(save_dir: Path) -> list:
    rows = (save_dir / "metrics.csv").read_text().splitlines()
    return [float(row.rsplit(",", 1)[1]) for row in rows if ",valid/loss," in row]


def test_score_mode_min_is_score_factor_minus_one_with_04s_file_names(runs):
    (factor_dir, _), (mode_dir, _) = runs["factor"], runs["mode"]
    files = _best_files(factor_dir)
    assert files == _best_files(mode_dir)
    # 0.4's names: factor x value, so negative; the kept file is the lowest loss's.
    (best,) = files
    assert re.fullmatch(r"valid_best_result_checkpoint_\d_-\d\.\d{4}\.pt", best)
    assert float(best.rsplit("_", 1)[1][: -len(".pt")]) == pytest.approx(
        -min(_logged_losses(mode_dir)), abs=1e-4
    )


def test_the_summary_shows_the_metrics_value_and_says_lower_is_better(runs):
    for save_dir, out in runs.values():
        value = min(_logged_losses(save_dir))
        line = next(line for line in out.splitlines() if line.startswith("  best "))
        assert f"valid/loss {value:.5g} (lower is better) at epoch" in line, line


def test_status_shows_the_metrics_value_and_says_lower_is_better(runs, capsys):
    save_dir, _ = runs["mode"]
    assert main(["status", str(save_dir)]) == 0
    out = capsys.readouterr().out
    value = min(_logged_losses(save_dir))
    assert f"valid/loss {value:.5g}, lower is better)" in out, out
    assert "score -" not in out


def test_runs_shows_the_metrics_value_and_says_lower_is_better(runs, capsys):
    assert main(["runs", str(runs["mode"][0].parent), "--csv"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [float(row.split(",")[2]) for row in rows] == [
        pytest.approx(min(_logged_losses(runs[name][0])), abs=1e-4) for name in ("factor", "mode")
    ]
    assert main(["runs", str(runs["mode"][0].parent)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "2 run(s) scored by valid/loss (lower is better), the best first"


def test_plot_says_lower_is_better_on_the_score_panel_only(runs, tmp_path):
    figure = plot_runs([runs["mode"][0]], tmp_path / "curves.png")
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[0] == "valid/loss (score, lower is better)"
    assert [t for t in titles if "lower is better" in t] == [titles[0]]


def test_a_higher_is_better_score_says_nothing_of_the_sort(tmp_path, capsys):
    save_dir, out = _train(capsys, tmp_path, "acc", max_epochs=1)
    assert "lower is better" not in out
    main(["status", str(save_dir)])
    assert "lower is better" not in capsys.readouterr().out


# ---- the config ----


def _validated(**fields):
    return validate_config(toy_config(save_dir="unused", **fields))


def test_score_mode_sets_the_factor_the_checkpoints_read():
    assert _validated(score_mode="min").score_factor == -1
    assert _validated(score_mode="max").score_factor == 1
    assert _validated(score_mode="min", score_factor=-2).score_factor == -2
    assert _validated(tester_score_mode="min").tester_score_factor == -1


@pytest.mark.parametrize(
    ("fields", "phrase"),
    [
        ({"score_mode": "max", "score_factor": -1}, "score_mode = 'max' contradicts score_factor"),
        ({"score_mode": "min", "score_factor": 2}, "'min' needs a negative factor"),
        ({"tester_score_mode": "lowest"}, "tester_score_mode = 'lowest': it must be 'max'"),
    ],
)
def test_a_score_mode_that_contradicts_or_is_unknown_is_a_config_error(fields, phrase):
    with pytest.raises(ConfigError, match=re.escape(phrase)):
        _validated(**fields)


def test_a_declared_engine_reads_its_own_score_mode():
    spec = EngineSpec.for_split("probe")
    assert spec.score_mode_field == "probe_score_mode"
    cfg = toy_config(save_dir="unused", probe_score_mode="min")
    validate_config(cfg, specs=(spec,))
    assert cfg.probe_score_factor == -1


def test_score_mode_is_an_override_and_config_shows_it(tmp_path, capsys):
    config = write_toy_config(tmp_path / "cfg.py", save_dir=str(tmp_path / "run"), **LOWER)
    assert main(["config", f"--config={config}", "--override=score_mode=min"]) == 0
    out = capsys.readouterr().out
    assert "score_mode: min" in out and "score_factor: -1" in out


def test_a_04_run_resumes_under_score_mode_said_in_words(tmp_path, capsys):
    save_dir, _out = _train(capsys, tmp_path, "old", score_factor=-1, **{**LOWER, "max_epochs": 1})
    config = tmp_path / "old.py"
    code = main(
        ["train", f"--config={config}", "--override=resume=True", "--override=max_epochs=2"]
        + ["--override=score_mode=min"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "valid/loss" in out and "(lower is better)" in out
    assert (save_dir / "latest_epoch_checkpoint_2.pt").exists()
