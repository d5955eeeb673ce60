"""Data helpers: datasets and augmentations from dotted paths, and DDP-aware dataloaders."""

import warnings
from collections.abc import Iterator, Mapping, Sized
from typing import Any, Callable, Optional

import ignite.distributed as idist
import torch
from torch.utils.data import DataLoader, Sampler

from gatle_ignite.dispatch import ConfigError, call_with_params, import_entrypoint

__all__ = [
    "LOADER_KEYS",
    "ExactDistributedSampler",
    "build_dataloader",
    "get_aug",
    "get_dataset",
    "resolve_collate_fn",
    "warn_if_eval_padded",
]

# The keys of a *_ds_params that build_dataloader reads; get_ds reads the others.
LOADER_KEYS = (
    "bs",
    "num_workers",
    "shuffle",
    "drop_last",
    "pin_memory",
    "exact_sharding",
    "collate_fn",
    "sampler_params",
)


def get_dataset(
    ds_name: str,
    ds_params: Optional[Mapping[str, Any]],
    transform: Optional[Callable] = None,
    field: str = "train_ds_name",
) -> tuple[Any, Any]:
    """Call ``<ds_name>.get_ds(ds_params, transform=transform)`` and check what it returns."""
    get_ds = import_entrypoint(ds_name, "get_ds", field=field)
    result = get_ds(ds_params or {}, transform=transform)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ConfigError(
            f"{ds_name}.get_ds must return (dataloader, info_dict), got {type(result).__name__}\n"
            f"  Return the loader together with a dict such as {{'length': len(dataset)}}."
        )
    dataloader, info = result
    if not hasattr(info, "get") or "length" not in info:
        raise ConfigError(
            f"{ds_name}.get_ds info dict must contain 'length', got {info!r}\n"
            f"  Add 'length': len(dataset) to the dict get_ds returns."
        )
    return dataloader, info


def get_aug(aug_name: Optional[str], aug_params: Optional[Mapping[str, Any]]) -> Optional[Any]:
    """Build ``<aug_name>.Transformation(**aug_params)``, or None when no augmentation is named."""
    if not aug_name:
        return None
    transformation = import_entrypoint(aug_name, "Transformation", field="aug_name")
    return call_with_params(transformation, aug_params, "aug_params")


class ExactDistributedSampler(Sampler):
    """One contiguous, unpadded block of the dataset per rank, for evaluation splits.

    Nothing is repeated or dropped, so metrics that all-reduce their counts equal the
    single-process value. Ranks may get one sample more than others, which would deadlock the
    all-reduces of a training step: never use it for training.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} out of range for num_replicas {num_replicas}")
        super().__init__()
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        base, extra = divmod(len(dataset), num_replicas)
        self.start = rank * base + min(rank, extra)
        self.num_samples = base + (1 if rank < extra else 0)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.start + self.num_samples))

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Accepted so it can stand in for a DistributedSampler; the order never changes."""


def resolve_collate_fn(ds_params: Mapping[str, Any]) -> Optional[Callable]:
    """The collate callable ``ds_params['collate_fn']`` names; None means torch's default."""
    collate = ds_params.get("collate_fn")
    if collate is None:
        return None
    if callable(collate):
        return collate
    if not (hasattr(collate, "get") and collate.get("cls_name")):
        raise ConfigError(
            f"ds_params['collate_fn'] must be a callable or "
            f"{{'cls_name': 'dotted.path', 'params': {{...}}}}, got {collate!r}\n"
            f"  Name the module that exposes get_collate_fn under 'cls_name'."
        )
    get_collate_fn = import_entrypoint(
        collate["cls_name"], "get_collate_fn", field="collate_fn.cls_name"
    )
    return get_collate_fn(**(collate.get("params") or {}))


def _build_sampler(dataset: Any, ds_params: Mapping[str, Any]) -> Optional[Sampler]:
    """The sampler ``ds_params['sampler_params']`` names, or None when it is unset."""
    sampler_params = ds_params.get("sampler_params")
    if not sampler_params:
        return None
    # .get so a missing cls_name becomes a ConfigError naming the field, not a bare KeyError
    get_sampler = import_entrypoint(
        sampler_params.get("cls_name"), "get_sampler", field="sampler_params.cls_name"
    )
    return get_sampler(dataset, **(sampler_params.get("params") or {}))


def _build_exact_sharded_loader(dataset: Any, ds_params: Mapping[str, Any]) -> DataLoader:
    """A plain DataLoader over this rank's ExactDistributedSampler block.

    auto_dataloader is avoided on purpose: it would wrap the sampler in a proxy that pads the
    shards with repeated samples. Batch size and workers are split like auto_dataloader does.
    """
    world_size = idist.get_world_size()
    batch_size = ds_params.get("bs", 1)
    num_workers = ds_params.get("num_workers", 0)
    if world_size > 1:
        if batch_size >= world_size:
            batch_size //= world_size
        nproc = idist.get_nproc_per_node()
        if num_workers >= nproc:
            num_workers = (num_workers + nproc - 1) // nproc
    kwargs = {
        "batch_size": batch_size,
        "num_workers": num_workers,
        "pin_memory": ds_params.get("pin_memory", torch.cuda.is_available()),
        # evaluation data is never dropped
        "drop_last": False,
        "sampler": ExactDistributedSampler(dataset, num_replicas=world_size, rank=idist.get_rank()),
    }
    collate = resolve_collate_fn(ds_params)
    if collate is not None:
        kwargs["collate_fn"] = collate
    return DataLoader(dataset, **kwargs)


def build_dataloader(
    dataset: Any, ds_params: Mapping[str, Any], sampler: Optional[Sampler] = None
) -> Any:
    """A loader for ``dataset`` from the loader keys of ``ds_params``, correct under DDP.

    ``bs`` is the total batch across all ranks. With ``exact_sharding`` and several processes
    each rank gets an unpadded contiguous shard; otherwise ignite's auto_dataloader splits the
    data with a (padding) distributed sampler.
    """
    if sampler is None:
        sampler = _build_sampler(dataset, ds_params)
    # An iterable dataset has no length to split, so it takes the normal path.
    exact = ds_params.get("exact_sharding") and isinstance(dataset, Sized)
    if exact and idist.get_world_size() > 1:
        if sampler is None:
            return _build_exact_sharded_loader(dataset, ds_params)
        warnings.warn(
            "exact_sharding is ignored because a sampler is set: under DDP ignite pads each "
            "rank's shard with repeated samples, and those padded duplicates will be scored.\n"
            "  Remove the sampler (sampler_params) from this split to shard it exactly.",
            stacklevel=2,
        )
    batch_size = ds_params.get("bs", 1)
    kwargs = {
        "batch_size": batch_size,
        "num_workers": ds_params.get("num_workers", 0),
        "drop_last": ds_params.get("drop_last", False),
        "pin_memory": ds_params.get("pin_memory", torch.cuda.is_available()),
    }
    if sampler is not None:
        if ds_params.get("shuffle"):
            warnings.warn(
                "shuffle=True is ignored because a sampler is set, and the sampler owns the "
                "order.\n  Drop shuffle from ds_params, or let the sampler shuffle.",
                stacklevel=2,
            )
        kwargs["sampler"] = sampler
    else:
        kwargs["shuffle"] = ds_params.get("shuffle", False)
    collate = resolve_collate_fn(ds_params)
    if collate is not None:
        kwargs["collate_fn"] = collate
    # an iterable dataset has no length to compare, so it is not checked
    if kwargs["drop_last"] and isinstance(dataset, Sized) and len(dataset) < batch_size:
        warnings.warn(
            f"drop_last=True with {len(dataset)} samples and bs={batch_size!r} produces no "
            f"batches, so this split is silently skipped.\n"
            f"  Lower bs or set drop_last=False.",
            stacklevel=2,
        )
    return idist.auto_dataloader(dataset, **kwargs)


def warn_if_eval_padded(split: str, dataloader: Any) -> None:
    """Warn when a loader the framework could not shard exactly scores duplicates under DDP:
    its sampler pads every rank's shard to the same length."""
    world = idist.get_world_size()
    if world <= 1 or dataloader is None:
        return
    if isinstance(getattr(dataloader, "sampler", None), ExactDistributedSampler):
        return
    dataset = getattr(dataloader, "dataset", None)
    try:
        remainder = len(dataset) % world
    except TypeError:
        return  # an iterable dataset has no length to check
    if remainder:
        warnings.warn(
            f"{split} split: {len(dataset)} samples do not divide across {world} ranks, so "
            f"{world - remainder} repeated sample(s) are scored.\n"
            f"  Build this split with gatle_ignite.build_dataloader to shard it exactly.",
            stacklevel=2,
        )
