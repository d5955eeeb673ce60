"""``sweep.json``: what a sweep directory holds, so that every later command continues that sweep.

Written when the sweep starts, atomically. It names the study and where it is stored (a URL's
credentials redacted), the config and its fingerprint, the overrides, the space, the metric and
its direction: what a sweep IS. Running the command again with any of those changed is refused,
since the trials would no longer be comparable; the trial count, the workers, the sampler and
the pruner may change from one command to the next.
"""

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.filesystem import read_confined, write_atomically

__all__ = ["RECORD_FILE", "SweepRecord"]

RECORD_FILE = "sweep.json"
FORMAT = 1
# What a sweep is; a command that changes one of these is not the same sweep.
_DEFINING = ("study", "storage", "config_fingerprint", "overrides", "params", "metric", "direction")


@dataclass
class SweepRecord:
    """The contents of ``sweep.json``."""

    sweep_id: str
    study: str
    storage: str
    config: str
    config_fingerprint: str
    overrides: list
    params: dict
    metric: str
    direction: str
    trials: int
    sampler: str
    pruner: str
    pruner_params: dict = field(default_factory=dict)
    created: str = ""
    format: int = FORMAT

    @classmethod
    def new(cls, **fields) -> "SweepRecord":
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return cls(sweep_id=uuid.uuid4().hex[:12], created=created, **fields)

    @classmethod
    def read(cls, sweep_dir) -> Optional["SweepRecord"]:
        path = Path(sweep_dir) / RECORD_FILE
        try:
            data = json.loads(read_confined(path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as error:
            raise ConfigError(f"{path} cannot be read: {error}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{path} is not a sweep record of format {FORMAT}")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, sweep_dir) -> None:
        text = json.dumps(asdict(self), indent=2) + "\n"
        write_atomically(Path(sweep_dir) / RECORD_FILE, text)

    def differences(self, other: "SweepRecord") -> list:
        """``[(field, recorded, asked)]`` for every defining field that differs."""
        mine, theirs = asdict(self), asdict(other)
        return [(k, mine[k], theirs[k]) for k in _DEFINING if mine[k] != theirs[k]]
