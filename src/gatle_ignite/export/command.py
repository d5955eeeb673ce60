"""``gatle-ignite export``: load the checkpoint as ``eval`` does, write one format into a staging
directory, load it back and check it against the eager model, then rename it into place."""

import importlib.util
import os
from pathlib import Path
from typing import Union

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.export import FORMATS, PACKAGES, WEIGHTS

__all__ = ["export_model", "require_extra"]


# torch's ONNX exporter works from a torch.export program from this version on.
_ONNX_TORCH = (2, 6)


def require_extra(fmt: str) -> None:
    """Refuse a format whose packages are not installed, naming the extra that brings them."""
    missing = [name for name in PACKAGES[fmt] if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"--format {fmt} needs {', '.join(missing)}, which is not installed.\n"
            f'  Install the export extra: pip install "gatle-ignite[export]".'
        )
    if fmt == "onnx":
        import torch

        if tuple(int(part) for part in torch.__version__.split(".")[:2]) < _ONNX_TORCH:
            raise ConfigError(
                f"--format onnx needs torch >= 2.6, whose ONNX exporter takes a torch.export "
                f"program; this is torch {torch.__version__}. pt2 and safetensors work with it."
            )


def export_model(
    cfg,
    fmt: str,
    out: Union[str, os.PathLike],
    ckpt: str = "best",
    weights: str = "eval",
    force: bool = False,
    dynamic=(),
) -> Path:
    """Export the model of ``cfg``'s ``ckpt`` as ``fmt`` into the directory ``out``;
    ``dynamic`` holds ``(input key, [dim])`` pairs to make dynamic beside those found.

    Nothing appears at ``out`` unless the written artefact loads back and computes what the
    eager model computes; an existing non-empty ``out`` is replaced only with ``force``.
    """
    if fmt not in FORMATS or weights not in WEIGHTS:
        raise ConfigError(f"export takes a format in {FORMATS} and weights in {WEIGHTS}")
    from gatle_ignite.export.card import write_card
    from gatle_ignite.export.directory import check_out_dir, publish, staged
    from gatle_ignite.export.source import load_source

    require_extra(fmt)
    out = Path(out)
    check_out_dir(out, force)
    source = load_source(cfg, ckpt, weights, dynamic)
    with staged(out) as staging:
        try:
            artefact = _write(fmt, source, staging, cfg)
        except ConfigError as error:
            raise ConfigError(f"{error}\n  Nothing was written to {out}.") from None
        write_card(fmt, staging, out, cfg, source, artefact)
        check_out_dir(out, force)
        publish(staging, out)
    files = sorted(path.name for path in out.iterdir())
    print(f"EXPORTED {fmt} to {out}: {', '.join(files)}")
    return out


def _write(fmt: str, source, staging: Path, cfg):
    if fmt == "safetensors":
        from gatle_ignite.export.safetensors_export import export_safetensors

        return export_safetensors(source, staging, cfg)
    if fmt == "pt2":
        from gatle_ignite.export.pt2_export import export_pt2

        return export_pt2(source, staging)
    from gatle_ignite.export.onnx_export import export_onnx

    return export_onnx(source, staging)
