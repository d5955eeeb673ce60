"""``gatle-ignite consolidate SRC.dcp OUT.pt``: one ordinary checkpoint from a sharded one.

The result holds full tensors, loads with ``torch.load(weights_only=True)``, and serves
``gatle-ignite eval --ckpt OUT.pt``, ``load_weights`` and ``model_checkpoint_dir`` under any
strategy and world size, in one process.
"""

from pathlib import Path

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.loading import UnreadableCheckpoint, load_checkpoint_file
from gatle_ignite.run.saving import save_atomically

__all__ = ["consolidate"]


def consolidate(source, out) -> int:
    """Read every shard of ``source`` and write their full tensors to ``out``."""
    source, out = Path(source), Path(out)
    if not (source.is_dir() and source.suffix == ".dcp"):
        raise ConfigError(
            f"{source} is not a sharded checkpoint (a .dcp directory).\n"
            f"  A .pt checkpoint is already whole: load it as it is."
        )
    try:
        sharded = load_checkpoint_file(source)
    except UnreadableCheckpoint as error:
        raise ConfigError(f"cannot consolidate {source}: {error.reason}.") from error
    state = sharded.full()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_atomically(state, out)
    tensors = sum(1 for _ in _tensors(state))
    print(f"CONSOLIDATED {source} -> {out}: {tensors} tensors, entries {sorted(state)}")
    return 0


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
