"""Data helpers (contract section 5): datasets, augmentations, samplers, collates, loaders."""

import warnings
from pathlib import Path

import ignite.distributed.utils as idist_utils
import pytest
import torch
from ml_collections import ConfigDict
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from gatle_ignite.data import helpers
from gatle_ignite.data.helpers import (
    ExactDistributedSampler,
    _build_exact_sharded_loader,
    build_dataloader,
    get_aug,
    get_dataset,
    resolve_collate_fn,
)
from gatle_ignite.dispatch import ConfigError

DATASETS = "data_fixtures.datasets"
AUGMENT = "data_fixtures.augment"
SAMPLERS = "data_fixtures.samplers"
COLLATE = "data_fixtures.collate"


@pytest.fixture(autouse=True)
def _fixture_modules_importable(monkeypatch):
    # the fixture modules are named by dotted path, as a config names a user's modules
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def _fake_world(monkeypatch, world_size, rank, nproc_per_node, *, inside_ignite=False):
    """Pretend to be ``rank`` of a ``world_size`` run without spawning processes.

    The helpers read the world through ``gatle_ignite.data.helpers.idist``. ignite's own
    auto_dataloader reads it from ``ignite.distributed.utils``, so ``inside_ignite`` patches
    that too (its DistributedSampler gets explicit num_replicas/rank and needs no process group).
    """
    targets = [helpers.idist, idist_utils] if inside_ignite else [helpers.idist]
    for target in targets:
        monkeypatch.setattr(target, "get_world_size", lambda: world_size)
        monkeypatch.setattr(target, "get_rank", lambda: rank)
        monkeypatch.setattr(target, "get_nproc_per_node", lambda: nproc_per_node)


def _batch_sizes(loader):
    return [len(batch) for batch in loader]


def _indices(loader):
    return [int(i) for batch in loader for i in batch]


# --- get_dataset -------------------------------------------------------------------------------


def test_get_dataset_returns_loader_and_info_and_passes_transform_by_keyword():
    transform = object()
    # the fixture's transform is keyword-only, so a positional call would raise TypeError
    loader, info = get_dataset(DATASETS, {"n": 3}, transform=transform)
    assert loader == [0, 1, 2]
    assert info["length"] == 3
    assert info["transform"] is transform


def test_get_dataset_passes_an_empty_dict_for_missing_params_and_no_transform_by_default():
    _, info = get_dataset(DATASETS, None)
    assert info["ds_params"] == {}
    assert info["transform"] is None


def test_get_dataset_hands_a_configdict_over_as_it_is():
    params = ConfigDict({"n": 2})
    loader, info = get_dataset(DATASETS, params)
    assert info["ds_params"] is params
    assert loader == [0, 1]


@pytest.mark.parametrize("mode", ["loader_only", "triple"])
def test_get_dataset_refuses_anything_but_a_pair(mode):
    with pytest.raises(ConfigError, match=r"get_ds must return \(dataloader, info_dict\)") as err:
        get_dataset(DATASETS, {"mode": mode})
    assert DATASETS in str(err.value)


@pytest.mark.parametrize("mode", ["no_length", "info_not_mapping"])
def test_get_dataset_needs_length_in_the_info_dict(mode):
    with pytest.raises(ConfigError, match="info dict must contain 'length'") as err:
        get_dataset(DATASETS, {"mode": mode})
    assert DATASETS in str(err.value)


def test_get_dataset_names_the_config_field_when_get_ds_is_missing():
    with pytest.raises(ConfigError, match="must expose 'get_ds'") as err:
        get_dataset(COLLATE, {}, field="valid_ds_name")
    assert "valid_ds_name" in str(err.value)


# --- get_aug -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [None, ""])
def test_get_aug_is_none_without_a_name(name):
    assert get_aug(name, {"scale": 3}) is None


def test_get_aug_builds_the_transformation_with_its_params():
    aug = get_aug(AUGMENT, ConfigDict({"scale": 3}))
    assert aug(2) == 6


def test_get_aug_without_params_uses_the_defaults():
    assert get_aug(AUGMENT, None).scale == 1


def test_get_aug_names_the_aug_name_field():
    with pytest.raises(ConfigError, match="aug_name"):
        get_aug(DATASETS, {})


# --- ExactDistributedSampler -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "world_size"), [(127, 2), (10, 3), (40, 2), (5, 8), (7, 1), (0, 2)]
)
def test_exact_sampler_splits_into_contiguous_unpadded_blocks(length, world_size):
    dataset = list(range(length))
    shards = [
        list(ExactDistributedSampler(dataset, num_replicas=world_size, rank=r))
        for r in range(world_size)
    ]
    # the rank blocks, in rank order, are the dataset itself: nothing repeated, dropped or moved
    assert [i for shard in shards for i in shard] == dataset
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1
    for r, shard in enumerate(shards):
        assert len(ExactDistributedSampler(dataset, world_size, r)) == len(shard)


def test_exact_sampler_gives_the_extra_samples_to_the_first_ranks():
    shards = [list(ExactDistributedSampler(range(10), 3, r)) for r in range(3)]
    assert shards == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [len(ExactDistributedSampler(range(127), 2, r)) for r in range(2)] == [64, 63]


@pytest.mark.parametrize("rank", [2, -1])
def test_exact_sampler_refuses_a_rank_outside_the_world(rank):
    with pytest.raises(ValueError, match=f"rank {rank} out of range for num_replicas 2"):
        ExactDistributedSampler(range(4), num_replicas=2, rank=rank)


def test_exact_sampler_set_epoch_keeps_the_order():
    sampler = ExactDistributedSampler(range(9), num_replicas=2, rank=1)
    before = list(sampler)
    sampler.set_epoch(7)
    assert list(sampler) == before == [5, 6, 7, 8]


# --- resolve_collate_fn ------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"collate_fn": None}])
def test_resolve_collate_fn_none_means_torch_default(params):
    assert resolve_collate_fn(params) is None


def test_resolve_collate_fn_returns_a_callable_unchanged():
    def collate(samples):
        return samples

    assert resolve_collate_fn({"collate_fn": collate}) is collate


def test_resolve_collate_fn_builds_from_cls_name_and_params():
    collate = resolve_collate_fn({"collate_fn": {"cls_name": COLLATE, "params": {"tag": "x"}}})
    assert collate([1, 2])["tag"] == "x"


def test_resolve_collate_fn_without_params_uses_the_entrypoint_defaults():
    collate = resolve_collate_fn(ConfigDict({"collate_fn": {"cls_name": COLLATE}}))
    assert collate([1, 2])["tag"] == "default"


@pytest.mark.parametrize("value", [COLLATE, {"params": {"tag": "x"}}, {"cls_name": ""}, 3])
def test_resolve_collate_fn_refuses_a_bare_string_or_a_mapping_without_cls_name(value):
    with pytest.raises(ConfigError, match="must be a callable or"):
        resolve_collate_fn({"collate_fn": value})


def test_resolve_collate_fn_names_its_field_for_a_missing_module():
    with pytest.raises(ConfigError, match="collate_fn.cls_name"):
        resolve_collate_fn({"collate_fn": {"cls_name": "data_fixtures.does_not_exist"}})


# --- build_dataloader, one process -------------------------------------------------------------


def test_build_dataloader_defaults():
    loader = build_dataloader(list(range(5)), {})
    assert isinstance(loader, DataLoader)
    assert loader.batch_size == 1
    assert loader.num_workers == 0
    assert loader.drop_last is False
    assert isinstance(loader.sampler, SequentialSampler)
    assert _indices(loader) == [0, 1, 2, 3, 4]


def test_build_dataloader_reads_the_loader_keys():
    params = ConfigDict({"bs": 4, "num_workers": 2, "drop_last": True, "shuffle": True})
    loader = build_dataloader(list(range(10)), params)
    assert loader.batch_size == 4
    assert loader.num_workers == 2
    assert loader.drop_last is True
    assert isinstance(loader.sampler, RandomSampler)


def test_build_dataloader_pin_memory_defaults_to_cuda_availability(monkeypatch):
    assert build_dataloader(list(range(4)), {}).pin_memory is torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert build_dataloader(list(range(4)), {}).pin_memory is True
    assert build_dataloader(list(range(4)), {"pin_memory": False}).pin_memory is False


def test_build_dataloader_builds_the_sampler_from_sampler_params():
    params = {"bs": 2, "sampler_params": {"cls_name": SAMPLERS, "params": {"reverse": True}}}
    loader = build_dataloader(list(range(4)), params)
    assert type(loader.sampler).__name__ == "FixedOrderSampler"
    assert _indices(loader) == [3, 2, 1, 0]


def test_build_dataloader_prefers_an_explicit_sampler_over_sampler_params():
    sampler = ExactDistributedSampler(range(4), num_replicas=2, rank=1)
    params = {"sampler_params": {"cls_name": "data_fixtures.does_not_exist"}}
    loader = build_dataloader(list(range(4)), params, sampler=sampler)
    assert loader.sampler is sampler
    assert _indices(loader) == [2, 3]


@pytest.mark.parametrize("sampler_params", [{"cls_name": AUGMENT}, {"params": {"reverse": True}}])
def test_build_dataloader_names_the_sampler_field_for_a_bad_or_missing_path(sampler_params):
    with pytest.raises(ConfigError, match="sampler_params.cls_name"):
        build_dataloader(list(range(4)), {"sampler_params": sampler_params})


def test_build_dataloader_warns_that_shuffle_is_ignored_with_a_sampler():
    params = {"shuffle": True, "sampler_params": {"cls_name": SAMPLERS}}
    with pytest.warns(UserWarning, match="shuffle"):
        loader = build_dataloader(list(range(4)), params)
    assert _indices(loader) == [0, 1, 2, 3]


def test_build_dataloader_is_quiet_with_a_sampler_and_no_shuffle():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_dataloader(list(range(4)), {"sampler_params": {"cls_name": SAMPLERS}})


def test_build_dataloader_warns_when_drop_last_leaves_no_batch():
    with pytest.warns(UserWarning, match="no batches"):
        loader = build_dataloader(list(range(3)), {"bs": 4, "drop_last": True})
    assert _batch_sizes(loader) == []


@pytest.mark.parametrize("params", [{"bs": 3, "drop_last": True}, {"bs": 4}])
def test_build_dataloader_does_not_warn_when_batches_remain(params):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_dataloader(list(range(3)), params)


def test_build_dataloader_honours_the_collate():
    params = {"bs": 2, "collate_fn": {"cls_name": COLLATE, "params": {"tag": "mine"}}}
    batch = next(iter(build_dataloader(list(range(4)), params)))
    assert batch["tag"] == "mine"
    assert batch["batch"].tolist() == [0, 1]


def test_build_dataloader_exact_sharding_changes_nothing_in_one_process():
    loader = build_dataloader(list(range(6)), {"bs": 2, "exact_sharding": True, "shuffle": True})
    assert isinstance(loader.sampler, RandomSampler)


# --- two ranks, simulated ----------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_two_rank_training_loader_splits_the_total_batch(monkeypatch, rank):
    _fake_world(monkeypatch, world_size=2, rank=rank, nproc_per_node=2, inside_ignite=True)
    loader = build_dataloader(list(range(40)), {"bs": 8, "num_workers": 2, "shuffle": True})
    assert isinstance(loader.sampler, DistributedSampler)
    assert loader.sampler.rank == rank
    assert loader.num_workers == 1
    loader = build_dataloader(list(range(40)), {"bs": 8, "shuffle": True})
    assert _batch_sizes(loader) == [4, 4, 4, 4, 4]


def test_two_rank_exact_sharded_loader_covers_everything_once(monkeypatch):
    shards = []
    for rank in (0, 1):
        _fake_world(monkeypatch, world_size=2, rank=rank, nproc_per_node=2)
        loader = _build_exact_sharded_loader(list(range(40)), {"bs": 8})
        assert isinstance(loader.sampler, ExactDistributedSampler)
        assert _batch_sizes(loader) == [4, 4, 4, 4, 4]
        shards.append(_indices(loader))
    assert [len(set(shard)) for shard in shards] == [20, 20]
    assert sorted(shards[0] + shards[1]) == list(range(40))


@pytest.mark.parametrize(("workers", "expected"), [(2, 1), (3, 2), (1, 1), (0, 0)])
def test_two_rank_exact_sharded_loader_divides_workers_like_ignite(monkeypatch, workers, expected):
    _fake_world(monkeypatch, world_size=2, rank=0, nproc_per_node=2)
    loader = _build_exact_sharded_loader(list(range(40)), {"bs": 8, "num_workers": workers})
    assert loader.num_workers == expected


def test_two_rank_exact_sharded_loader_keeps_a_batch_smaller_than_the_world(monkeypatch):
    _fake_world(monkeypatch, world_size=2, rank=1, nproc_per_node=2)
    loader = _build_exact_sharded_loader(list(range(40)), {"bs": 1})
    assert _batch_sizes(loader) == [1] * 20


def test_exact_sharded_loader_never_drops_or_shuffles(monkeypatch):
    _fake_world(monkeypatch, world_size=2, rank=0, nproc_per_node=2)
    params = {"bs": 8, "drop_last": True, "shuffle": True}
    loader = _build_exact_sharded_loader(list(range(41)), params)
    assert loader.drop_last is False
    assert _indices(loader) == list(range(21))
    assert _batch_sizes(loader) == [4, 4, 4, 4, 4, 1]


def test_exact_sharded_loader_works_in_one_process():
    loader = _build_exact_sharded_loader(list(range(5)), {"bs": 2})
    assert _indices(loader) == [0, 1, 2, 3, 4]
    assert _batch_sizes(loader) == [2, 2, 1]


def test_exact_sharded_loader_honours_the_collate_and_pin_memory(monkeypatch):
    _fake_world(monkeypatch, world_size=2, rank=1, nproc_per_node=2)
    params = {"bs": 4, "collate_fn": {"cls_name": COLLATE, "params": {"tag": "eval"}}}
    batch = next(iter(_build_exact_sharded_loader(list(range(8)), params)))
    assert batch["tag"] == "eval"
    assert batch["batch"].tolist() == [4, 5]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _build_exact_sharded_loader(list(range(8)), {}).pin_memory is True


def test_build_dataloader_shards_exactly_under_ddp_without_a_sampler(monkeypatch):
    _fake_world(monkeypatch, world_size=2, rank=1, nproc_per_node=2)
    loader = build_dataloader(list(range(127)), {"bs": 8, "exact_sharding": True})
    assert isinstance(loader.sampler, ExactDistributedSampler)
    assert _indices(loader) == list(range(64, 127))


def test_build_dataloader_exact_sharding_with_a_sampler_warns_and_pads(monkeypatch):
    _fake_world(monkeypatch, world_size=2, rank=0, nproc_per_node=2, inside_ignite=True)
    params = {"bs": 8, "exact_sharding": True, "sampler_params": {"cls_name": SAMPLERS}}
    with pytest.warns(UserWarning, match="padded duplicates"):
        loader = build_dataloader(list(range(5)), params)
    # the normal path: ignite wraps the custom sampler in its padding proxy
    assert not isinstance(loader.sampler, ExactDistributedSampler)
    assert isinstance(loader.sampler, DistributedSampler)
    assert loader.batch_size == 4
    assert len(loader.sampler) == 3
