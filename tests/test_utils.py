"""Utilities: batch values and devices, checkpoint discovery and weight loading, seeding."""

import copy
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gatle_ignite import ConfigError
from gatle_ignite.utils.batch import get_value, to_device
from gatle_ignite.utils.checkpoints import (
    BEST_SUFFIX,
    LATEST_PREFIX,
    RunMeta,
    _candidates,
    best_prefix_for,
    find_best_checkpoint,
    find_latest_checkpoint,
    load_weights,
    resolve_eval_checkpoint,
    score_of,
)
from gatle_ignite.utils.seed import setup_seed
from tests.toy.model import Model
from tests.toy.trainer import Trainer

# ---- get_value ----


def test_get_value_reads_a_single_key():
    assert get_value({"a": 1, "valid/acc": 0.5}, "a") == 1
    assert get_value({"a": 1, "valid/acc": 0.5}, "valid/acc") == 0.5


@pytest.mark.parametrize("path", [("b", "c"), ["b", "c"]])
def test_get_value_walks_a_tuple_or_list_path(path):
    assert get_value({"b": {"c": 2}}, path) == 2


def test_get_value_walks_through_sequences_too():
    assert get_value({"out": [{"x": 7}]}, ("out", 0, "x")) == 7


def test_a_missing_path_step_names_the_path_walked():
    with pytest.raises(ConfigError) as info:
        get_value({"a": 1, "b": {"c": 2}}, ("b", "nope"))
    assert "could not resolve path ('b', 'nope') at 'b -> nope'" in str(info.value)


def test_a_missing_path_step_lists_the_keys_there():
    with pytest.raises(ConfigError) as info:
        get_value({"targets": {"label": 1, "mask": 2}}, ("targets", "labels"))
    assert str(info.value) == (
        "could not resolve path ('targets', 'labels') at 'targets -> labels': "
        "KeyError('labels'); available at targets: ['label', 'mask']"
    )


def test_targets_missing_from_what_prep_batch_returned_says_how_to_add_them():
    prepared = {"model_input": {"x": 1}, "labels": 2}
    with pytest.raises(ConfigError) as info:
        get_value(prepared, ("targets", "labels"))
    assert str(info.value) == (
        "could not resolve path ('targets', 'labels') at 'targets': KeyError('targets'); "
        "available at the top: ['model_input', 'labels']\n"
        "  prep_batch returned no 'targets': add it to the dict it returns, e.g. "
        '{"model_input": ..., "targets": {"labels": y}}, or point the path at a key it has.'
    )


def test_a_list_path_is_shown_as_a_tuple():
    with pytest.raises(ConfigError, match=r"could not resolve path \('b', 'nope'\) at 'b -> nope'"):
        get_value({"b": {}}, ["b", "nope"])


def test_a_missing_first_step_stops_the_arrow_path_there():
    with pytest.raises(ConfigError) as info:
        get_value({"a": 1}, ("x", "y", "z"))
    message = str(info.value)
    assert "at 'x'" in message and "x -> y" not in message


def test_a_type_error_on_a_path_is_a_config_error():
    # 3["c"] raises TypeError, converted like a KeyError.
    with pytest.raises(ConfigError, match="at 'b -> c'"):
        get_value({"b": 3}, ("b", "c"))


def test_a_missing_key_lists_the_available_keys():
    with pytest.raises(ConfigError) as info:
        get_value({"probs": 1, "features": 2}, "logits")
    assert "could not resolve 'logits'; available: ['probs', 'features']" in str(info.value)


def test_a_non_mapping_container_shows_its_type():
    with pytest.raises(ConfigError) as info:
        get_value(5, "logits")
    message = str(info.value)
    assert "could not resolve 'logits'; available:" in message and "int" in message


def test_a_tensor_looked_up_by_name_says_the_model_must_return_a_dict():
    with pytest.raises(ConfigError) as info:
        get_value(torch.zeros(16, 3), "logits")
    message = str(info.value)
    assert "could not resolve 'logits'; available: <class 'torch.Tensor'> of shape [16, 3]" in (
        message
    )
    assert "forward must return a dict of named outputs" in message


def test_index_errors_are_not_converted():
    with pytest.raises(IndexError):
        get_value([1, 2], 5)
    with pytest.raises(IndexError):
        get_value({"a": [1]}, ("a", 3))


# ---- to_device ----


def test_to_device_moves_nested_tensors_and_leaves_strings():
    batch = {
        "x": torch.ones(2),
        "parts": [torch.zeros(1), "text", b"raw"],
        "pair": (torch.arange(2), "label"),
        "inner": {"y": torch.ones(1, 1), "name": "n"},
    }
    moved = to_device(batch, device="meta")
    assert moved["x"].device.type == "meta" and moved["x"].shape == (2,)
    assert moved["inner"]["y"].device.type == "meta"
    assert isinstance(moved["parts"], list) and isinstance(moved["pair"], tuple)
    assert moved["parts"][0].device.type == "meta"
    assert moved["parts"][1:] == ["text", b"raw"]
    assert moved["pair"][0].device.type == "meta" and moved["pair"][1] == "label"
    assert moved["inner"]["name"] == "n"


def test_to_device_leaves_numbers_none_and_objects_untouched():
    marker = object()
    batch = {"x": torch.ones(2), "index": 3, "extra": [None, 1.5, marker]}
    moved = to_device(batch, device="meta")
    assert moved["x"].device.type == "meta"
    assert moved["index"] == 3
    assert moved["extra"][0] is None and moved["extra"][1] == 1.5
    assert moved["extra"][2] is marker


def test_to_device_defaults_to_the_run_device(monkeypatch):
    monkeypatch.setattr("gatle_ignite.utils.batch.idist.device", lambda: torch.device("meta"))
    moved = to_device({"x": torch.ones(3), "k": "key"})
    assert moved["x"].device.type == "meta" and moved["k"] == "key"


def test_to_device_on_cpu_keeps_values():
    moved = to_device([torch.tensor([1.0, 2.0]), (torch.tensor(3),)])
    assert torch.equal(moved[0], torch.tensor([1.0, 2.0]))
    assert moved[0].device.type == "cpu" and isinstance(moved[1], tuple)


def test_to_device_returns_a_tensor_already_on_the_device_as_it_is():
    x, y = torch.ones(2, 3), torch.arange(2)
    moved = to_device({"model_input": {"x": x}, "targets": (y,)}, "cpu")
    assert moved["model_input"]["x"] is x and moved["targets"][0] is y


# ---- names, score_of ----


def test_name_constants_and_best_prefix_for():
    assert LATEST_PREFIX == "latest_epoch"
    assert BEST_SUFFIX == "best_result"
    assert best_prefix_for() == "best_result"
    assert best_prefix_for("valid_") == "valid_best_result"
    assert best_prefix_for("test_") == "test_best_result"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("valid_best_result_checkpoint_15_0.9258.pt", 0.9258),
        ("valid_best_result_checkpoint_3_-0.25.pt", -0.25),
        ("valid_best_result_checkpoint_3_-0.2500.pt", -0.25),
        ("valid_best_result_checkpoint_2_-250.5000.pt", -250.5),
        ("latest_epoch_checkpoint_3.pt", 3.0),
        ("no_numbers_here.pt", None),
        ("valid_best_result_checkpoint.pt", None),
    ],
)
def test_score_of(name, expected):
    assert score_of(name) == expected


def test_score_of_reads_the_file_name_not_the_directory(tmp_path):
    assert score_of(Path("runs_7.1") / "latest_epoch_checkpoint_4.pt") == 4.0
    assert score_of(str(tmp_path / "run_5" / "no_numbers_here.pt")) is None


# ---- discovery ----


def _touch(directory, name, mtime):
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.utime(path, (mtime, mtime))
    return path


def test_candidates_are_a_sorted_glob_or_empty(tmp_path):
    assert _candidates(tmp_path / "missing", "latest_epoch") == []
    _touch(tmp_path, "latest_epoch_checkpoint_2.pt", 1000)
    _touch(tmp_path, "latest_epoch_checkpoint_1.pt", 2000)
    _touch(tmp_path, "latest_epoch_checkpoint_1.pth", 2000)
    _touch(tmp_path, "other_1.pt", 2000)
    names = [p.name for p in _candidates(tmp_path, "latest_epoch")]
    assert names == ["latest_epoch_checkpoint_1.pt", "latest_epoch_checkpoint_2.pt"]
    assert [p.name for p in _candidates(tmp_path, "latest_epoch", "pth")] == [
        "latest_epoch_checkpoint_1.pth"
    ]


def test_find_latest_is_the_newest_by_mtime_not_the_highest_epoch(tmp_path):
    _touch(tmp_path, "latest_epoch_checkpoint_3.pt", 1000)
    newest = _touch(tmp_path, "latest_epoch_checkpoint_2.pt", 2000)
    _touch(tmp_path, "valid_best_result_checkpoint_9_0.9.pt", 3000)
    assert Path(find_latest_checkpoint(tmp_path)) == newest


def test_find_latest_honours_the_extension(tmp_path):
    _touch(tmp_path, "latest_epoch_checkpoint_1.pt", 1000)
    other = _touch(tmp_path, "latest_epoch_checkpoint_2.pth", 500)
    assert Path(find_latest_checkpoint(tmp_path, extension="pth")) == other


def test_find_latest_without_files_is_none(tmp_path):
    assert find_latest_checkpoint(tmp_path / "missing") is None
    assert find_latest_checkpoint(tmp_path) is None
    _touch(tmp_path, "valid_best_result_checkpoint_1_0.5000.pt", 1000)
    assert find_latest_checkpoint(tmp_path) is None


def test_the_highest_score_beats_a_newer_file(tmp_path):
    best = _touch(tmp_path, "valid_best_result_checkpoint_1_0.9000.pt", 1000)
    _touch(tmp_path, "valid_best_result_checkpoint_3_0.6000.pt", 2000)
    assert Path(find_best_checkpoint(tmp_path, prefix="valid_")) == best


def test_negative_scores_below_minus_one_hundred_compare(tmp_path):
    best = _touch(tmp_path, "valid_best_result_checkpoint_1_-250.5000.pt", 1000)
    _touch(tmp_path, "valid_best_result_checkpoint_2_-300.0000.pt", 2000)
    assert Path(find_best_checkpoint(tmp_path, prefix="valid_")) == best


def test_each_prefix_picks_its_own_best(tmp_path):
    valid = _touch(tmp_path, "valid_best_result_checkpoint_1_0.5000.pt", 1000)
    test = _touch(tmp_path, "test_best_result_checkpoint_1_0.4000.pt", 1000)
    _touch(tmp_path, "test_best_result_checkpoint_2_0.1000.pt", 3000)
    _touch(tmp_path, "probe_best_result_checkpoint_1_0.9900.pt", 2000)
    assert Path(find_best_checkpoint(tmp_path, prefix="valid_")) == valid
    assert Path(find_best_checkpoint(tmp_path, prefix="test_")) == test
    # The empty prefix means files that start with best_result.
    assert find_best_checkpoint(tmp_path) is None
    plain = _touch(tmp_path, "best_result_checkpoint_1_0.1000.pt", 1000)
    assert Path(find_best_checkpoint(tmp_path)) == plain


def test_equal_scores_go_to_the_newer_file(tmp_path):
    newer = _touch(tmp_path, "valid_best_result_checkpoint_1_0.5000.pt", 2000)
    _touch(tmp_path, "valid_best_result_checkpoint_2_0.5000.pt", 1000)
    assert Path(find_best_checkpoint(tmp_path, prefix="valid_")) == newer


def test_without_parsable_scores_the_newest_file_wins(tmp_path):
    _touch(tmp_path, "valid_best_result_b.pt", 1000)
    newest = _touch(tmp_path, "valid_best_result_a.pt", 2000)
    assert Path(find_best_checkpoint(tmp_path, prefix="valid_")) == newest


def test_a_parsed_score_beats_a_newer_unparsable_file(tmp_path):
    scored = _touch(tmp_path, "valid_best_result_checkpoint_1_0.1000.pt", 1000)
    _touch(tmp_path, "valid_best_result_manual.pt", 2000)
    assert Path(find_best_checkpoint(tmp_path, prefix="valid_")) == scored


def test_find_best_without_files_is_none(tmp_path):
    assert find_best_checkpoint(tmp_path / "missing", prefix="valid_") is None
    assert find_best_checkpoint(tmp_path, prefix="valid_") is None


def test_find_best_honours_the_extension(tmp_path):
    _touch(tmp_path, "valid_best_result_checkpoint_1_0.9000.pt", 1000)
    other = _touch(tmp_path, "valid_best_result_checkpoint_1_0.1000.ckpt", 1000)
    assert Path(find_best_checkpoint(tmp_path, prefix="valid_", extension="ckpt")) == other


def test_resolve_eval_checkpoint_best_and_latest(tmp_path):
    latest = _touch(tmp_path, "latest_epoch_checkpoint_3.pt", 3000)
    best = _touch(tmp_path, "valid_best_result_checkpoint_2_0.8000.pt", 2000)
    _touch(tmp_path, "valid_best_result_checkpoint_3_0.7000.pt", 3000)
    _touch(tmp_path, "test_best_result_checkpoint_3_0.9900.pt", 4000)
    assert Path(resolve_eval_checkpoint(tmp_path, "latest")) == latest
    assert Path(resolve_eval_checkpoint(tmp_path, "best")) == best
    # The default mode is best, on the valid_ prefix; the tester's files are never chosen.
    assert Path(resolve_eval_checkpoint(tmp_path)) == best
    # Anything other than "latest" means best.
    assert Path(resolve_eval_checkpoint(tmp_path, "anything")) == best
    assert Path(resolve_eval_checkpoint(tmp_path, "best", prefix="test_")).name.startswith(
        "test_best_result"
    )


def test_resolve_eval_checkpoint_without_files_is_none(tmp_path):
    assert resolve_eval_checkpoint(tmp_path / "missing", "best") is None
    assert resolve_eval_checkpoint(tmp_path / "missing", "latest") is None
    _touch(tmp_path, "test_best_result_checkpoint_1_0.5000.pt", 1000)
    assert resolve_eval_checkpoint(tmp_path, "best") is None


# ---- RunMeta ----


def test_run_meta_state_round_trip():
    meta = RunMeta(5)
    assert meta.max_epochs == 5 and meta.restored_max_epochs is None
    assert meta.state_dict() == {"max_epochs": 5}
    meta.load_state_dict({"max_epochs": 3})
    assert meta.restored_max_epochs == 3
    # Loading records what was saved, without overwriting the current max_epochs.
    assert meta.max_epochs == 5 and meta.state_dict() == {"max_epochs": 5}


def test_run_meta_load_without_the_key_restores_none():
    meta = RunMeta(4)
    meta.load_state_dict({"max_epochs": 9})
    meta.load_state_dict({})
    assert meta.restored_max_epochs is None and meta.max_epochs == 4


# ---- load_weights ----


def _fresh(seed):
    torch.manual_seed(seed)
    return Model()


def _sd(x):
    return x.state_dict() if hasattr(x, "state_dict") else x


def _same(a, b):
    a, b = _sd(a), _sd(b)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _differ(a, b):
    return not _same(a, b)


def test_load_weights_from_a_path(tmp_path, capsys):
    source, target = _fresh(0), _fresh(1)
    assert _differ(source, target)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": source.state_dict(), "optimizer": {"state": {}}}, path)
    load_weights(str(path), target)
    assert _same(source, target)
    assert "LOADED 4/4 tensors" in capsys.readouterr().out
    other = _fresh(2)
    load_weights(path, other)  # a Path works too
    assert _same(source, other)


def test_load_weights_from_a_full_checkpoint_dict():
    source, target = _fresh(0), _fresh(1)
    state = {
        "model": source.state_dict(),
        "optimizer": {"state": {}, "param_groups": []},
        "trainer": {"epoch": 3},
        "ema": {"decay": 0.9},
    }
    result = load_weights(state, target)
    assert _same(source, target)
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []


def test_load_weights_from_a_bare_state_dict():
    source, target = _fresh(0), _fresh(1)
    load_weights(source.state_dict(), target)
    assert _same(source, target)


def test_load_weights_strips_the_ddp_prefix():
    source, target = _fresh(0), _fresh(1)
    state = {f"module.{k}": v for k, v in source.state_dict().items()}
    load_weights(state, target)
    assert _same(source, target)


class Wrapper(nn.Module):
    """Keys like DDP's: every one starts with module."""

    def __init__(self, inner):
        super().__init__()
        self.module = inner


def test_load_weights_adds_the_ddp_prefix():
    source, target = _fresh(0), Wrapper(_fresh(1))
    load_weights(source.state_dict(), target)
    assert _same(source, target.module)


def test_load_weights_with_prefixes_on_both_sides_loads_as_is():
    source, target = Wrapper(_fresh(0)), Wrapper(_fresh(1))
    load_weights(source.state_dict(), target)
    assert _same(source, target)


def test_a_checkpoint_matching_nothing_is_refused_even_non_strict():
    target = _fresh(1)
    before = copy.deepcopy(target.state_dict())
    state = {"encoder.weight": torch.zeros(16, 8), "encoder.bias": torch.zeros(16)}
    for strict in (True, False):
        with pytest.raises(ConfigError) as info:
            load_weights(state, target, strict=strict)
        message = str(info.value)
        assert "loaded 0 of 4 tensors from an in-memory checkpoint" in message
        assert "encoder.weight" in message and "net.0.weight" in message
        assert _same(before, target)


def test_a_file_matching_nothing_names_the_file(tmp_path):
    path = tmp_path / "other_model.pt"
    torch.save({"model": {"head.weight": torch.zeros(2)}}, path)
    target = _fresh(1)
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(ConfigError, match="loaded 0 of 4 tensors from") as info:
        load_weights(str(path), target, strict=False)
    assert str(path) in str(info.value)
    assert _same(before, target)


def test_a_partial_match_loads_what_matches_when_not_strict(capsys):
    source, target = _fresh(0), _fresh(1)
    before = copy.deepcopy(target.state_dict())
    partial = {k: v for k, v in source.state_dict().items() if k.startswith("net.0.")}
    result = load_weights(partial, target, strict=False)
    assert "LOADED 2/4 tensors" in capsys.readouterr().out
    assert torch.equal(target.net[0].weight, source.net[0].weight)
    assert torch.equal(target.net[3].weight, before["net.3.weight"])
    assert sorted(result.missing_keys) == ["net.3.bias", "net.3.weight"]


def test_a_partial_match_raises_torchs_missing_keys_when_strict():
    source, target = _fresh(0), _fresh(1)
    partial = {k: v for k, v in source.state_dict().items() if k.startswith("net.0.")}
    with pytest.raises(RuntimeError, match="Missing key"):
        load_weights(partial, target, strict=True)


class _Payload:
    """Unpickling this would run a shell command that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


@pytest.mark.parametrize("wrap", [lambda p: {"model": p}, lambda p: p])
def test_a_pickled_object_is_refused_and_never_executed(tmp_path, wrap):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save(wrap(_Payload(marker)), path)
    assert not marker.exists()
    target = _fresh(1)
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(ConfigError, match="refusing to load"):
        load_weights(str(path), target, strict=False)
    assert not marker.exists()
    assert _same(before, target)


# ---- setup_seed ----


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(4)


@pytest.fixture
def restore_seed_side_effects(monkeypatch):
    benchmark = torch.backends.cudnn.benchmark
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    yield
    torch.backends.cudnn.benchmark = benchmark


def test_setup_seed_repeats_every_generator(restore_seed_side_effects):
    setup_seed(123)
    first = _draws()
    setup_seed(123)
    second = _draws()
    assert first[0] == second[0] and first[1] == second[1]
    assert torch.equal(first[2], second[2])
    setup_seed(124)
    third = _draws()
    assert third[0] != first[0] and third[1] != first[1]
    assert not torch.equal(third[2], first[2])


def test_setup_seed_sets_pythonhashseed(restore_seed_side_effects):
    setup_seed(77)
    assert os.environ["PYTHONHASHSEED"] == "77"


def test_setup_seed_seeds_cuda(restore_seed_side_effects, monkeypatch):
    # torch.manual_seed seeds CUDA itself, so record it apart to see setup_seed's own call.
    calls = []
    monkeypatch.setattr(torch, "manual_seed", lambda seed: calls.append(("cpu", seed)))
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: calls.append(("cuda", seed)))
    setup_seed(9)
    assert ("cpu", 9) in calls and ("cuda", 9) in calls


def test_setup_seed_sets_cudnn_benchmark(restore_seed_side_effects):
    setup_seed(1, cudnn_benchmark=True)
    assert torch.backends.cudnn.benchmark is True
    setup_seed(1)
    assert torch.backends.cudnn.benchmark is False


def test_the_trainer_seeds_from_the_config(make_cfg, restore_seed_side_effects):
    cfg = make_cfg(seed=7, cudnn_benchmark=True)
    Trainer(0, cfg)
    assert os.environ["PYTHONHASHSEED"] == "7"
    assert torch.backends.cudnn.benchmark is True
    a = Trainer(0, make_cfg(seed=7)).setup().model
    b = Trainer(0, make_cfg(seed=7)).setup().model
    c = Trainer(0, make_cfg(seed=8)).setup().model
    assert _same(a, b) and _differ(a, c)
