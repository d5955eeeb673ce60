"""The model card, ``README.md`` beside every export: where the model comes from and how it was
checked, read from the run directory's manifest, and how to load it."""

import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Optional

import torch

import gatle_ignite
from gatle_ignite.export import PACKAGES
from gatle_ignite.export.shapes import Dims
from gatle_ignite.export.source import Source
from gatle_ignite.export.verify import flat_tensors
from gatle_ignite.redaction import config_payload
from gatle_ignite.run import identity
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.run.storage import place_of

__all__ = ["CARD", "Artefact", "write_card"]

CARD = "README.md"


@dataclass
class Artefact:
    """What a format's writer wrote and how it checked it."""

    file: str
    tolerance: str
    # [(what it ran on, {output key: max abs diff})], one per check.
    checked: list
    # The program's dynamic and static dimensions; None for a format that traces nothing.
    dims: Optional[Dims] = None
    extra_files: list = field(default_factory=list)
    # The format's own rows of the card: [(name, value)].
    rows: list = field(default_factory=list)


def _manifest(save_dir) -> Optional[Manifest]:
    try:
        # A URL's run.json is in its read cache, where loading the checkpoint put it.
        return Manifest.read(place_of(save_dir).path)
    except (OSError, ValueError, TypeError):
        return None


def _best_line(cfg, manifest: Optional[Manifest]) -> str:
    bests = [] if manifest is None else manifest.checkpoints
    bests = [e for e in bests if e.kind == "best" and e.score is not None]
    if not bests:
        return "not recorded"
    top = max(bests, key=lambda e: (e.score, e.iteration or 0))
    factor = cfg.get("score_factor", 1) or 1
    return f"`{cfg.get('score_name', 'score')}` = {top.score / factor:.6g} (epoch {top.epoch})"


def _run_line(cfg, manifest: Optional[Manifest]) -> str:
    where = f"`{cfg.save_dir}`"
    if manifest is None:
        return f"`{cfg.name}` in {where} (no run.json)"
    return (
        f"`{manifest.name}` (id {manifest.run_id}, {manifest.state}, trained to epoch "
        f"{manifest.trained_epoch}) in {where}"
    )


def _checkpoint_line(source: Source, manifest: Optional[Manifest]) -> str:
    name = PurePosixPath(str(source.checkpoint)).name
    entry = manifest.entry(name) if manifest is not None else None
    epoch = f" (epoch {entry.epoch})" if entry is not None and entry.epoch is not None else ""
    sharded = ", sharded: consolidated" if name.endswith(".dcp") else ""
    return f"`{source.checkpoint}`{epoch}{sharded}"


def _weights_line(source: Source) -> str:
    if not source.swapped:
        return "the checkpoint's model weights (eval_context swaps none in)"
    if source.weights == "eval":
        return f"eval: those the {source.split} evaluation saw (eval_context swaps them in)"
    return "raw: the trained weights, not those eval_context swaps in for evaluation"


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).replace('torch.', '')}{list(tensor.shape)}"


def _versions(fmt: str) -> str:
    found = [f"gatle-ignite {gatle_ignite.__version__}", f"torch {torch.__version__}"]
    found += [f"{name} {metadata.version(name)}" for name in PACKAGES[fmt]]
    return ", ".join([*found, f"Python {platform.python_version()}"])


def _checked_line(artefact: Artefact) -> str:
    parts = []
    for on, differences in artefact.checked:
        worst = ", ".join(f"`{key}` {value:.3g}" for key, value in differences.items())
        parts.append(f"{on}: max abs diff {worst}")
    return f"outputs equal the eager model's {artefact.tolerance}; " + "; ".join(parts)


def _loading(fmt: str, out: Path, cfg, source: Source, artefact: Artefact) -> str:
    call = ", ".join(f"{key}=..." for key in source.inputs)
    path = out / artefact.file
    if fmt == "safetensors":
        params = json.dumps(config_payload(cfg)["model_params"])
        module = cfg.model_name
        return (
            f"from safetensors.torch import load_file\n"
            f"from {module} import Model\n\n"
            f"model = Model(**{params})  # config.json holds model_name and model_params\n"
            f'model.load_state_dict(load_file("{path}"))\n'
            f"model.eval()\n"
            f"outputs = model({call})"
        )
    if fmt == "pt2":
        return (
            f"import torch\n\n"
            f'program = torch.export.load("{path}")\n'
            f"outputs = program.module()({call})  # a dict of the model's outputs, by name"
        )
    feeds = ", ".join(f'"{name}": ...' for name in flat_tensors(source.inputs))
    names = ", ".join(artefact.checked[0][1])
    return (
        f"import onnxruntime\n\n"
        f'session = onnxruntime.InferenceSession("{path}", providers=["CPUExecutionProvider"])\n'
        f"outputs = session.run(None, {{{feeds}}})  # numpy arrays: {names}"
    )


def _fixed_inputs(fmt: str, source: Source) -> list:
    """The table row for non-tensor inputs, which the exporter turns into constants."""
    fixed = {key: value for key, value in source.inputs.items() if not flat_tensors(value)}
    if not fixed:
        return []
    named = ", ".join(f"`{key}={value!r}`" for key, value in fixed.items())
    if fmt == "onnx":
        return [("Fixed inputs", f"{named}: baked into the graph, not inputs")]
    return [("Fixed inputs", f"{named}: constants of the program, pass the same")]


def _dims_rows(dims: Dims, source: Source) -> list:
    """The dynamic dimensions, each with its range and bound, and the marked ones kept static."""
    described = []
    for axis in dims.axes:
        where = " and ".join(f"`{key}` dim {dim}" for key, dim in axis.positions)
        bound = f" ({axis.bound})" if axis.bound else ""
        name = "the batch: " if axis.batch else ""
        refused = "".join(f"; its guards refuse {size} ({why})" for size, why in axis.refused)
        described.append(f"{name}{where}, {axis.range_text()}{bound}{refused}")
    rows = [("Dynamic dimensions", "; ".join(described) or "none: the example's shapes only")]
    if not dims.batch_dynamic and source.rows is not None:
        rows.append(("Batch dimension", f"static ({source.rows} rows)"))
    static = [f"`{key}` dim {dim} = {size} ({why})" for key, dim, size, why in dims.fixed()]
    if static:
        rows.append(("Static dimensions", "; ".join(static) + ": the model fixes them"))
    return rows


def _table(fmt: str, cfg, source: Source, artefact: Artefact) -> list:
    manifest = _manifest(cfg.save_dir)
    fingerprint = (
        manifest.config_fingerprint
        if manifest is not None
        else identity.fingerprint(config_payload(cfg))
    )
    inputs = ", ".join(f"`{key}` {_describe(t)}" for key, t in flat_tensors(source.inputs).items())
    rows = [
        ("Run", _run_line(cfg, manifest)),
        ("Checkpoint", _checkpoint_line(source, manifest)),
        ("Weights", _weights_line(source)),
        ("Best score", _best_line(cfg, manifest)),
        ("Config fingerprint", f"`{fingerprint}`"),
        ("Model", f"`{cfg.model_name}`"),
        ("Example inputs", f"{inputs}, one batch of the {source.split} split"),
    ]
    if artefact.dims is not None:
        rows += [*_dims_rows(artefact.dims, source), *_fixed_inputs(fmt, source)]
    return [
        *rows,
        *artefact.rows,
        ("Checked", _checked_line(artefact)),
        ("Versions", _versions(fmt)),
        ("Exported", datetime.now(timezone.utc).isoformat(timespec="seconds")),
    ]


def write_card(fmt: str, staging: Path, out: Path, cfg, source: Source, artefact: Artefact):
    """Write ``README.md`` into ``staging`` (it will be ``out``)."""
    files = ", ".join(f"`{name}`" for name in (artefact.file, *artefact.extra_files))
    arguments = ", ".join(f"`{key}`" for key in source.inputs)
    outputs = ", ".join(f"`{key}`" for key in artefact.checked[0][1])
    text = "\n".join(
        [
            f"# {cfg.name}: {fmt} export",
            "",
            f"Written by `gatle-ignite export --format {fmt}`: {files}. The model takes the "
            f"keyword arguments {arguments} and returns {outputs}. It runs in float32; "
            f"autocast is not part of it.",
            "",
            "| | |",
            "|---|---|",
            *(f"| {name} | {value} |" for name, value in _table(fmt, cfg, source, artefact)),
            "",
            "## Loading it",
            "",
            "```python",
            _loading(fmt, out, cfg, source, artefact),
            "```",
            "",
        ]
    )
    (staging / CARD).write_text(text, encoding="utf-8")
