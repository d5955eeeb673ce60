"""``--format pt2``: the model as a ``torch.export`` program, ``model.pt2``.

Written with ``torch.export.save``; checked by loading it back with ``torch.export.load`` and
running ``program.module()(**model_input)``, whose outputs must equal the eager model's exactly
(the program runs the same ATen operators on the same weights).
"""

from pathlib import Path

import torch

from gatle_ignite.export.card import Artefact
from gatle_ignite.export.failure import failed_at, quiet_exporter
from gatle_ignite.export.program import size_checks, trace
from gatle_ignite.export.source import Source
from gatle_ignite.export.verify import EXACT, check_against_eager, flat_tensors

__all__ = ["FILE", "export_pt2"]

FILE = "model.pt2"


def export_pt2(source: Source, staging: Path) -> Artefact:
    """Write and check ``model.pt2`` in ``staging``; returns what the model card records."""
    traced = trace(source)
    path = staging / FILE
    try:
        with quiet_exporter():
            torch.export.save(traced.program, path)
            loaded = torch.export.load(path).module()
    except Exception as error:
        raise failed_at(f"writing {FILE} (torch.export.save / load)", error) from None

    def run(inputs):
        try:
            return flat_tensors(loaded(**inputs))
        except Exception as error:
            raise failed_at(f"running the loaded {FILE}", error) from None

    checked = check_against_eager(
        FILE, source.model, size_checks(traced, source.inputs), run, EXACT
    )
    return Artefact(FILE, str(EXACT), checked, dims=traced.dims)
