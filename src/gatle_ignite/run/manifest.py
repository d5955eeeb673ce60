"""``run.json``: what a run directory holds, written by the framework and readable by a person.

The run's identity, the config it was started with, its state, how far it trained, and the
index of its checkpoints with the epoch and iteration each was written at. Every write replaces
the whole file atomically, so a reader sees the old manifest or the new one, never a mix.
"""

import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from gatle_ignite.run.layout import MANIFEST_FILE, Entry, staging_path
from gatle_ignite.run.sweep_trial import trial_record

__all__ = ["STATES", "Entry", "Manifest", "write_atomically"]

FORMAT = 1
# Every state a run can be left in. A run found "running" whose lock is free was killed.
# "pruned": its sweep stopped it after an evaluation as clearly behind; it is finished.
STATES = ("running", "completed", "early-stopped", "pruned", "preempted", "failed", "diverged")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a kill at any moment leaves the old file or the new.

    Not fsynced, as the checkpoints are not: a killed process loses nothing the kernel holds,
    and an fsync per checkpoint costs milliseconds the loop would wait for (bench.train_step);
    a power cut is what the start's reconciliation of the index with the files is for.
    """
    staging = staging_path(path, uuid.uuid4().hex[:8])
    with open(staging, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(staging, path)


@dataclass
class Manifest:
    """The contents of ``run.json``."""

    run_id: str
    name: str
    created: str
    config: dict
    config_fingerprint: str
    state: str = "running"
    stop_reason: str = ""
    host: str = ""
    updated: str = ""
    max_epochs: Optional[int] = None
    epoch_length: Optional[int] = None
    trained_epoch: int = 0
    trained_iteration: int = 0
    accepted_changes: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)
    # The sweep trial this run is (run.sweep_trial.trial_record), or None.
    sweep: Optional[dict] = None
    format: int = FORMAT

    @classmethod
    def new(cls, name: str, config: dict, fingerprint: str) -> "Manifest":
        return cls(
            run_id=uuid.uuid4().hex[:12],
            name=name,
            created=_now(),
            config=config,
            config_fingerprint=fingerprint,
            host=socket.gethostname(),
            sweep=trial_record(),
        )

    @classmethod
    def read(cls, save_dir) -> Optional["Manifest"]:
        """The manifest in ``save_dir``; None when there is none. Raises ValueError when the
        file exists but is not a manifest this version can read."""
        path = Path(save_dir) / MANIFEST_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a run manifest of format {FORMAT}")
        entries = [Entry(**entry) for entry in data.pop("checkpoints", [])]
        return cls(**data, checkpoints=entries)

    def write(self, save_dir) -> None:
        self.updated = _now()
        data = asdict(self)
        write_atomically(Path(save_dir) / MANIFEST_FILE, json.dumps(data, indent=2) + "\n")

    # ---- the checkpoint index ----

    def entry(self, file: str) -> Optional[Entry]:
        return next((e for e in self.checkpoints if e.file == file), None)

    def record(self, entry: Entry, removed=()) -> None:
        """Index ``entry`` (replacing one of the same name) and drop the ``removed`` files."""
        gone = {entry.file, *removed}
        self.checkpoints = [e for e in self.checkpoints if e.file not in gone] + [entry]

    def forget(self, files) -> None:
        gone = set(files)
        self.checkpoints = [e for e in self.checkpoints if e.file not in gone]

    def resumable_newest_first(self) -> list:
        """The resumable entries, furthest-trained first."""
        entries = [e for e in self.checkpoints if e.resumable]
        return sorted(entries, key=Entry.progress_key, reverse=True)

    def describe(self) -> str:
        """One line naming the run, for messages about it."""
        trained = f"epoch {self.trained_epoch}, iteration {self.trained_iteration}"
        return (
            f"run '{self.name}' (id {self.run_id}, {self.state}, trained to {trained}, "
            f"{len(self.checkpoints)} checkpoint(s), last written {self.updated or self.created})"
        )
