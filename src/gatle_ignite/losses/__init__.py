"""Losses a config names by dotted path, like a project's own.

Each built-in term is a module exposing ``Loss(src_name=..., tgt_name=..., **torch kwargs)``;
``criterion_name`` may name one directly, or ``composite`` may weigh and gate several.
"""

# The built-in loss modules, for the references and the checks that list them.
BUILTINS = (
    "gatle_ignite.losses.composite",
    "gatle_ignite.losses.cross_entropy",
    "gatle_ignite.losses.mse",
    "gatle_ignite.losses.l1",
    "gatle_ignite.losses.smooth_l1",
    "gatle_ignite.losses.bce_with_logits",
    "gatle_ignite.losses.model_loss",
)
