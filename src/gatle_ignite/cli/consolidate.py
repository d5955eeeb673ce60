"""``gatle-ignite consolidate SRC.dcp OUT.pt``: one ordinary checkpoint from a sharded one.

The result holds full tensors, loads with ``torch.load(weights_only=True)``, and serves
``gatle-ignite eval --ckpt OUT.pt``, ``load_weights`` and ``model_checkpoint_dir`` under any
strategy and world size, in one process.
"""

import tempfile
from pathlib import Path

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.loading import UnreadableCheckpoint, load_checkpoint_file
from gatle_ignite.run.saving import save_atomically
from gatle_ignite.run.storage import is_url, place_of

__all__ = ["consolidate"]


def consolidate(source, out) -> int:
    """Read every shard of ``source`` and write their full tensors to ``out``; either may be
    a URL (object storage)."""
    if is_url(source):
        sharded_there = source.endswith(".dcp") and place_of(source).exists(".metadata")
    else:
        source = Path(source)
        sharded_there = source.is_dir() and source.suffix == ".dcp"
    if not sharded_there:
        raise ConfigError(
            f"{source} is not a sharded checkpoint (a .dcp directory).\n"
            f"  A .pt checkpoint is already whole: load it as it is."
        )
    try:
        sharded = load_checkpoint_file(source)
    except UnreadableCheckpoint as error:
        raise ConfigError(f"cannot consolidate {source}: {error.reason}.") from error
    state = sharded.full()
    _write(state, out)
    tensors = sum(1 for _ in _tensors(state))
    print(f"CONSOLIDATED {source} -> {out}: {tensors} tensors, entries {sorted(state)}")
    return 0


def _write(state, out) -> None:
    """``torch.save`` to ``out``, a path or a URL (written here, then published whole)."""
    if not is_url(out):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        save_atomically(state, Path(out))
        return
    folder, name = out.rstrip("/").rsplit("/", 1)
    with tempfile.TemporaryDirectory(prefix="gatle-consolidate-") as here:
        place = place_of(folder, local=Path(here))
        save_atomically(state, place.path / name)
        place.publish(name)


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
