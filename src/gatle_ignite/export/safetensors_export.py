"""``--format safetensors``: the model's weights alone, ``model.safetensors``, and ``config.json``
holding what rebuilds the model (``model_name``, ``model_params``).

Every tensor of the model's state dict is written under its own name, so
``safetensors.torch.load_file`` gives a state dict ``load_state_dict`` takes as it is (a tied
weight is written under each of its names). Checked by building a fresh ``Model(**model_params)``,
loading the file into it with ``gatle_ignite.load_weights`` and running it: the outputs must
equal the eager model's exactly.
"""

import json
import shutil
from pathlib import Path

import torch

from gatle_ignite.dispatch import ConfigError, call_with_params, import_entrypoint
from gatle_ignite.export.card import Artefact
from gatle_ignite.export.failure import failed_at
from gatle_ignite.export.source import Source
from gatle_ignite.export.verify import EXACT, check_against_eager, described, flat_tensors
from gatle_ignite.redaction import REDACTED, config_payload
from gatle_ignite.run.identity import flatten
from gatle_ignite.run.loading import load_weights

__all__ = ["CONFIG", "FILE", "export_safetensors", "tied_names"]

FILE = "model.safetensors"
CONFIG = "config.json"


def tied_names(model) -> list:
    """``[[name, name, ...]]``: the state dict's names that hold one tensor (tied weights, as
    a language model's output layer shares its input embedding), the first as ordered."""
    groups = {}
    for key, value in model.state_dict().items():
        if torch.is_tensor(value) and value.numel():
            where = (value.untyped_storage().data_ptr(), value.storage_offset(), value.shape)
            groups.setdefault(where, []).append(key)
    return [names for names in groups.values() if len(names) > 1]


def _tied_row(model) -> list:
    tied = tied_names(model)
    if not tied:
        return []
    pairs = "; ".join(" = ".join(f"`{name}`" for name in names) for names in tied)
    return [
        (
            "Tied weights",
            f"{pairs}: one tensor in the model, written under each name (safetensors keeps no "
            f"shared tensors); Model(**model_params) ties them again and loading fills both",
        )
    ]


def _weights(model) -> dict:
    """The state dict as safetensors takes it: contiguous CPU tensors, none sharing memory."""
    state, seen = {}, set()
    for key, value in model.state_dict().items():
        if not torch.is_tensor(value):
            raise ConfigError(
                f"the model's state dict holds {key!r}, a {type(value).__name__}; safetensors "
                f"holds tensors only. Export it as pt2 instead."
            )
        tensor = value.detach().cpu().contiguous()
        storage = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if storage in seen or tensor.untyped_storage().nbytes() != tensor.nbytes:
            # A tied weight or a view of a bigger tensor: safetensors refuses shared memory.
            tensor = tensor.clone()
        seen.add(storage)
        state[key] = tensor
    return state


def _rebuilt(cfg) -> torch.nn.Module:
    """A fresh model from the config alone: what config.json promises rebuilds it."""
    Model = import_entrypoint(cfg.model_name, "Model", field="model_name")
    return call_with_params(Model, cfg.model_params, "model_params").eval()


def export_safetensors(source: Source, staging: Path, cfg) -> Artefact:
    """Write and check ``model.safetensors`` and ``config.json`` in ``staging``."""
    from safetensors.torch import save_file

    rebuild = {"model_name": cfg.model_name, "model_params": config_payload(cfg)["model_params"]}
    (staging / CONFIG).write_text(json.dumps(rebuild, indent=2) + "\n", encoding="utf-8")
    path = staging / FILE
    save_file(_weights(source.model), str(path), metadata={"format": "pt"})
    # safetensors creates its file readable by its owner only; give it config.json's mode.
    shutil.copymode(staging / CONFIG, path)
    fresh = _rebuilt(cfg)
    try:
        load_weights(path, fresh, strict=True)
    except (RuntimeError, ConfigError) as error:
        raise ConfigError(
            f"export check failed ({FILE}): the weights do not load into a fresh "
            f"Model(**model_params): {str(error).splitlines()[0]}\n"
            f"  config.json promises that model_name and model_params rebuild the model; a "
            f"Trainer whose build_model changes the model breaks that promise."
        ) from None

    def run(inputs):
        try:
            return flat_tensors(fresh(**inputs))
        except Exception as error:
            raise failed_at(f"running a fresh Model(**model_params) with {FILE}", error) from None

    checks = [(described(source.inputs), source.inputs)]
    checked = check_against_eager(FILE, source.model, checks, run, EXACT)
    rows = [*_tied_row(source.model), *_secrets_row(rebuild["model_params"])]
    return Artefact(FILE, str(EXACT), checked, extra_files=[CONFIG], rows=rows)


def _secrets_row(params: dict) -> list:
    """A row naming the model_params config.json holds redacted: a rebuild must be given them."""
    hidden = [name for name, value in flatten(params).items() if value == REDACTED]
    if not hidden:
        return []
    named = ", ".join(f"`model_params.{name}`" for name in hidden)
    return [
        (
            "Not in config.json",
            f"{named}: named like a secret, so written {REDACTED}; "
            f"pass the value yourself when you rebuild the model",
        )
    ]
