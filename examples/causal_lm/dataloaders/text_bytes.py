"""Bytes of Python's own standard library sources, on any machine with Python: the first 90%
of them train, the rest validate. Each sample is a window of ``length`` bytes and the bytes
that follow each one."""

import importlib.util
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from gatle_ignite import build_dataloader

MODULES = ("argparse", "textwrap", "difflib", "calendar", "fractions", "dataclasses", "inspect")


def read_bytes(modules=MODULES):
    files = [Path(importlib.util.find_spec(name).origin) for name in modules]
    return torch.tensor(list(b"".join(path.read_bytes() for path in files)))


def get_ds(ds_params, transform=None):
    data, length = read_bytes(), ds_params["length"]
    cut = int(len(data) * 0.9)
    data = data[:cut] if ds_params["split"] == "train" else data[cut:]
    windows = data.unfold(0, length + 1, ds_params.get("stride", length))
    dataset = TensorDataset(windows[:, :-1], windows[:, 1:])
    return build_dataloader(dataset, ds_params), {"length": len(dataset)}
