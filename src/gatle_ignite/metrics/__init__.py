"""Metrics a config names by dotted path, like a project's own.

Each built-in is a module exposing ``get_metric(engine_type, info, src_name=..., tgt_name=...,
...)`` that returns an ``ignite.metrics`` metric, so it is exact under DDP and on unevenly
sharded evaluation splits: every one sums counts that are all-reduced once per run.
"""

# The built-in metric modules, for the references and the checks that list them.
BUILTINS = (
    "gatle_ignite.metrics.accuracy",
    "gatle_ignite.metrics.top_k_accuracy",
    "gatle_ignite.metrics.precision",
    "gatle_ignite.metrics.recall",
    "gatle_ignite.metrics.f1",
    "gatle_ignite.metrics.perplexity",
    "gatle_ignite.metrics.mae",
    "gatle_ignite.metrics.mse",
    "gatle_ignite.metrics.loss",
)
