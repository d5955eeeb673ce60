"""EngineSpec: one engine described as data, so a task adds an engine by declaring it.

Read by the config checks and by the trainer alike, so it sits below both.
"""

from dataclasses import dataclass
from typing import Optional

from gatle_ignite.dispatch import ConfigError

__all__ = ["EVAL_SPECS", "TRAIN_SPEC", "EngineSpec"]


@dataclass(frozen=True)
class EngineSpec:
    key: str
    engine_type: str
    metrics_field: str
    every_field: Optional[str] = None
    length_field: Optional[str] = None
    score_field: Optional[str] = None
    score_factor_field: Optional[str] = None
    early_stop_patience_field: Optional[str] = None
    early_stop_after_field: Optional[str] = None
    ds_prefix: Optional[str] = None
    step: str = "eval_step"
    with_losses: bool = False
    total_loss: bool = True
    label: Optional[str] = None
    progress_every: int = 100

    @property
    def split(self) -> str:
        return self.ds_prefix or self.engine_type

    @property
    def progress_label(self) -> str:
        return self.label or self.engine_type.upper()

    @property
    def ckpt_prefix(self) -> str:
        return f"{self.engine_type}_"

    @property
    def score_mode_field(self) -> Optional[str]:
        """The field saying the score's direction in words (``max`` or ``min``) beside its
        factor: ``score_mode``, ``tester_score_mode``, ``<name>_score_mode``. None for a
        factor field named otherwise."""
        factor = self.score_factor_field
        if factor is None or not factor.endswith("score_factor"):
            return None
        return factor.removesuffix("score_factor") + "score_mode"

    @classmethod
    def for_split(cls, name: str, **overrides) -> "EngineSpec":
        """An eval engine whose config fields follow the `<name>_*` / `every_<name>` convention."""
        return cls(
            key=name,
            engine_type=name,
            metrics_field=f"{name}_metrics",
            every_field=f"every_{name}",
            length_field=f"{name}_length",
            score_field=f"{name}_score_name",
            score_factor_field=f"{name}_score_factor",
            early_stop_patience_field=f"{name}_early_stop_patience",
            early_stop_after_field=f"{name}_early_stop_after",
            **overrides,
        )

    def cadence(self, cfg) -> int:
        """Run every N trainer epochs; 0 disables the engine."""
        if self.every_field is None:
            return 1
        value = cfg.get(self.every_field, None)
        if value is None:
            raise ConfigError(
                f"engine '{self.key}' declares cadence field '{self.every_field}', which this "
                f"config does not set. Add cfg.{self.every_field} = N (0 disables it)."
            )
        return value

    def length(self, cfg) -> Optional[int]:
        return cfg.get(self.length_field, None) if self.length_field else None


TRAIN_SPEC = EngineSpec(
    key="trainer",
    engine_type="train",
    metrics_field="train_metrics",
    length_field="train_length",
    step="train_step",
    with_losses=True,
)

EVAL_SPECS = (
    EngineSpec(
        key="evaluator",
        engine_type="valid",
        metrics_field="val_metrics",
        every_field="every_val",
        length_field="val_length",
        score_field="score_name",
        score_factor_field="score_factor",
        early_stop_patience_field="early_stop_patience",
        early_stop_after_field="early_stop_after",
    ),
    EngineSpec(
        key="tester",
        engine_type="test",
        metrics_field="tester_metrics",
        every_field="every_test",
        length_field="test_length",
        score_field="tester_score_name",
        score_factor_field="tester_score_factor",
    ),
)
