"""A ``get_ds`` whose return value is chosen by ``ds_params['mode']``, to exercise the checks."""

from typing import Any, Optional


def get_ds(ds_params, *, transform: Optional[Any] = None):
    """Keyword-only ``transform``, so a positional call fails loudly."""
    mode = ds_params.get("mode", "ok")
    data = list(range(ds_params.get("n", 4)))
    if mode == "loader_only":
        return data
    if mode == "triple":
        return data, {"length": len(data)}, None
    if mode == "no_length":
        return data, {"num_classes": 2}
    if mode == "info_not_mapping":
        return data, len(data)
    return data, {"length": len(data), "transform": transform, "ds_params": ds_params}
