"""0.4's import path for EngineSpec and the default specs; they live in ``gatle_ignite.specs``."""

from gatle_ignite.specs import EVAL_SPECS, TRAIN_SPEC, EngineSpec

__all__ = ["EVAL_SPECS", "TRAIN_SPEC", "EngineSpec"]
