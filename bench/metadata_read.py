"""What reading a sharded checkpoint's ``.metadata`` safely costs, against DCP's own read.

    python -m bench.metadata_read [--layers 1500] [--reps 3]

Saves one checkpoint with DCP (a stack of small Linear layers and AdamW's state: four entries
per layer's tensor, about 2.6 MB of metadata at the default size), then times, best of
``--reps``: DCP's read (the C unpickler, no checks), the restricted unpickler alone (Python's
own, whose memo cannot be sized by the file), and ``read_metadata`` (that unpickler, then every
check against the files present).
"""

import argparse
import io
import pickle
import tempfile
import time
from pathlib import Path


def _best(func, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1500)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed.checkpoint as dcp

    from gatle_ignite.run import sharded_metadata

    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(args.layers)])
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(1, 8)).sum().backward()
    optimizer.step()
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder) / "bench.dcp"
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        dcp.save(state, checkpoint_id=directory, no_dist=True)
        data = (directory / ".metadata").read_bytes()
        entries = len(pickle.loads(data).state_dict_metadata)
        print(f"metadata: {len(data) / 1e6:.1f} MB, {entries} entries")
        variants = (
            ("DCP's read (C unpickler, no checks)", lambda: pickle.loads(data)),
            (
                "restricted unpickler",
                lambda: sharded_metadata._MetadataUnpickler(io.BytesIO(data)).load(),
            ),
            (
                "read_metadata (unpickler + checks)",
                lambda: sharded_metadata.read_metadata(directory),
            ),
        )
        for name, func in variants:
            print(f"{name:40s} {_best(func, args.reps) * 1000:7.0f} ms")


if __name__ == "__main__":
    main()
