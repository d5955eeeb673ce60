"""AdamW with BEiT/ViT-style layer-wise learning-rate decay."""

from collections.abc import Sequence
from typing import Any

import ignite.distributed as idist
import torch
from torch import nn

from gatle_ignite.dispatch import ConfigError

__all__ = ["get_optimizer"]

# Where get_optimizer's **kwargs go, with the arguments it gives there itself: the config
# check accepts the other keywords of torch.optim.AdamW in optimizer_params.
KWARGS_GO_TO = ((torch.optim.AdamW, ("params",)),)

# Parameters before the first block share the lowest learning rate.
_EMBEDDING_TOKENS = ("cls_token", "mask_token", "pos_embed", "patch_embed")


def _resolve_backbone(model: nn.Module, backbone_attr: str) -> nn.Module:
    backbone = model.module if hasattr(model, "module") else model
    for part in backbone_attr.split(".") if backbone_attr else []:
        if not hasattr(backbone, part):
            children = (
                sorted(name for name, _ in backbone.named_children())
                if isinstance(backbone, nn.Module)
                else []
            )
            raise ConfigError(
                f"backbone_attr {backbone_attr!r} does not resolve: "
                f"{type(backbone).__name__} has no attribute {part!r}.\n"
                f"  Available: {children}"
            )
        backbone = getattr(backbone, part)
    return backbone


def _depth(name: str, blocks_attr: str, n_layers: int) -> int:
    if any(token in name for token in _EMBEDDING_TOKENS):
        return 0
    marker = f"{blocks_attr}."
    if marker in name:
        return int(name.split(marker, 1)[1].split(".", 1)[0]) + 1
    return n_layers


def get_optimizer(
    model: nn.Module,
    lr: float = 1e-4,
    layer_decay: float = 0.75,
    weight_decay: float = 0.05,
    backbone_attr: str = "",
    blocks_attr: str = "blocks",
    betas: Sequence[float] = (0.9, 0.999),
    **kwargs: Any,
):
    """AdamW whose groups scale ``lr`` by ``layer_decay`` per block counted from the head."""
    backbone = _resolve_backbone(model, backbone_attr)
    blocks = getattr(backbone, blocks_attr, None)
    if blocks is None:
        raise ConfigError(
            f"blocks_attr {blocks_attr!r} not found on {type(backbone).__name__}.\n"
            f"  Set optimizer_params.backbone_attr to the dotted path of the module holding the "
            f"blocks, and optimizer_params.blocks_attr to the name of its block list."
        )
    n_layers = len(blocks) + 1
    scales = [layer_decay ** (n_layers - i) for i in range(n_layers + 1)]
    no_decay_names = (
        set(backbone.no_weight_decay()) if hasattr(backbone, "no_weight_decay") else set()
    )

    groups: dict[str, dict[str, Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        skip_decay = (
            param.ndim == 1
            or name.endswith(".bias")
            or any(name == nd or name.endswith(f".{nd}") for nd in no_decay_names)
        )
        depth = _depth(name, blocks_attr, n_layers)
        key = f"layer_{depth}_{'no_decay' if skip_decay else 'decay'}"
        if key not in groups:
            groups[key] = {
                "lr": lr * scales[depth],
                "weight_decay": 0.0 if skip_decay else weight_decay,
                "params": [],
                "name": key,
            }
        groups[key]["params"].append(param)

    optimizer = torch.optim.AdamW(list(groups.values()), lr=lr, betas=tuple(betas), **kwargs)
    return idist.auto_optim(optimizer)
