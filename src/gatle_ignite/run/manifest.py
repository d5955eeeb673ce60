"""``run.json``: what a run directory holds, written by the framework and readable by a person.

The run's identity, the config it was started with, its state, how far it trained, how each
process that trained it was made, and the index of its checkpoints with the epoch and iteration
each was written at. Every write replaces
the whole file atomically, so a reader sees the old manifest or the new one, never a mix.
"""

import json
import socket
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from gatle_ignite.redaction import redact
from gatle_ignite.run.filesystem import UnsafeFile, read_confined, write_atomically
from gatle_ignite.run.layout import MANIFEST_FILE, Entry, parse_checkpoint_name
from gatle_ignite.run.sweep_trial import trial_record

__all__ = ["STATES", "Entry", "Manifest", "checked_entry", "write_atomically"]

FORMAT = 1
# Every state a run can be left in. "preempted" saved where it stopped; "interrupted" stopped
# at once (a second Ctrl-C) and resumes from an earlier checkpoint, as does a run found
# "running" whose lock is free: it was killed. "pruned": its sweep stopped it after an
# evaluation as clearly behind; it is finished.
STATES = (
    "running",
    "completed",
    "early-stopped",
    "pruned",
    "preempted",
    "interrupted",
    "failed",
    "diverged",
)


# Holds the config's place in run.json while the rest is rendered; unguessable, so no value of
# a run's (its name, a checkpoint's) is ever taken for it.
_CONFIG_SLOT = f"\0config-{uuid.uuid4().hex}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
    # One record per process that started or resumed the run (run.provenance); absent before 0.5.
    provenance: list = field(default_factory=list)
    # The names of the optimizer's param groups, in the order of train/lr_<i>; empty when the
    # groups are unnamed.
    lr_groups: list = field(default_factory=list)
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
        """The manifest in ``save_dir``; None when there is none. Raises ValueError when
        ``run.json`` is there but is not a manifest this version can read: not a regular file
        (a FIFO, a device, a link out of ``save_dir``), larger than ``RECORD_LIMIT``, not JSON,
        another format, or a field of the wrong type."""
        path = Path(save_dir) / MANIFEST_FILE
        try:
            text = read_confined(path).decode("utf-8")
        except FileNotFoundError:
            return None
        except UnsafeFile as error:
            raise ValueError(f"{path} cannot be read: {error}") from error
        except OSError as error:
            raise ValueError(f"{path} cannot be read: {error.strerror}") from error
        try:
            data = json.loads(text)
        except RecursionError:
            raise ValueError(f"{path} nests deeper than any manifest") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a run manifest of format {FORMAT}")
        _check_fields(data, _MANIFEST_TYPES, str(path), required=_REQUIRED)
        if data.get("state", "running") not in STATES:
            raise ValueError(f"{path}: state {data['state']!r} is none of {', '.join(STATES)}")
        for accepted in data.get("accepted_changes", []):
            if not (isinstance(accepted, dict) and isinstance(accepted.get("changes"), dict)):
                raise ValueError(f"{path}: an accepted change is {accepted!r}, not a record")
        if not all(isinstance(start, dict) for start in data.get("provenance", [])):
            raise ValueError(f"{path}: a provenance record is not an object")
        entries = data.pop("checkpoints", [])
        return cls(**data, checkpoints=[checked_entry(entry, path) for entry in entries])

    def write(self, save_dir, last_word: bool = False) -> None:
        """Replace ``run.json``; ``last_word``: the end of a failing run, written in place when
        the disk is too full for a new file."""
        self.updated = _now()
        if self.provenance:
            # How long this process has had the run: to its end, or a kill's last checkpoint.
            self.provenance[-1]["until"] = self.updated
        rest, config, config_text = self._redacted()
        text = json.dumps({**rest, "config": _CONFIG_SLOT}, indent=2)
        text = text.replace(json.dumps(_CONFIG_SLOT), config_text, 1) + "\n"
        compact = None
        if last_word:
            compact = json.dumps({**rest, "config": config}, separators=(",", ":")) + "\n"
        write_atomically(Path(save_dir) / MANIFEST_FILE, text, when_full=compact)

    def _redacted(self) -> tuple:
        """``(every other field, the config, the config's indented text)``, redacted:
        stop_reason quotes an exception, which may quote a URL with its credentials. The config,
        the largest part, is redacted and rendered once per config: a run rewrites the file at
        every checkpoint, and its config does not change."""
        cached = self.__dict__.get("_config_redacted")
        if cached is None or cached[0] is not self.config:
            config = redact(self.config)
            # At the depth of a field of run.json: JSON strings hold no raw newline.
            text = json.dumps(config, indent=2).replace("\n", "\n  ")
            cached = self._config_redacted = (self.config, config, text)
        rest = redact(asdict(replace(self, config={})))
        return rest, cached[1], cached[2]

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

    def accepted_before(self) -> set:
        """The fields an earlier resume of this run accepted a change of."""
        return {name for record in self.accepted_changes for name in record["changes"]}

    def describe(self) -> str:
        """One line naming the run, for messages about it."""
        trained = f"epoch {self.trained_epoch}, iteration {self.trained_iteration}"
        return (
            f"run '{self.name}' (id {self.run_id}, {self.state}, trained to {trained}, "
            f"{len(self.checkpoints)} checkpoint(s), last written {self.updated or self.created})"
        )


# ---- what read() accepts: each field's types, so that a file of valid JSON with a wrong type
# in it is a damaged manifest, found when it is read rather than an epoch later ----

_TEXT, _COUNT, _MAYBE_COUNT = (str,), (int,), (int, type(None))
_MANIFEST_TYPES = {
    "run_id": _TEXT,
    "name": _TEXT,
    "created": _TEXT,
    "config": (dict,),
    "config_fingerprint": _TEXT,
    "state": _TEXT,
    "stop_reason": _TEXT,
    "host": _TEXT,
    "updated": _TEXT,
    "max_epochs": _MAYBE_COUNT,
    "epoch_length": _MAYBE_COUNT,
    "trained_epoch": _COUNT,
    "trained_iteration": _COUNT,
    "accepted_changes": (list,),
    "provenance": (list,),
    "lr_groups": (list,),
    "sweep": (dict, type(None)),
    "checkpoints": (list,),
    "format": _COUNT,
}
_ENTRY_TYPES = {
    "file": _TEXT,
    "kind": _TEXT,
    "epoch": _MAYBE_COUNT,
    "iteration": _MAYBE_COUNT,
    "engine": _TEXT,
    "score": (int, float, type(None)),
}
_REQUIRED = ("run_id", "name", "created", "config", "config_fingerprint")
_KIND_NAMES = {
    str: "text",
    int: "a whole number >= 0",
    float: "a number",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def _check_fields(data: dict, types: dict, where: str, required=()) -> None:
    unknown = sorted(set(data) - set(types))
    missing = [name for name in required if name not in data]
    if unknown or missing:
        raise ValueError(f"{where} has unknown fields {unknown} or lacks required ones {missing}")
    for name, value in data.items():
        if not _fits(value, types[name]):
            wanted = " or ".join(_KIND_NAMES[t] for t in types[name])
            raise ValueError(f"{where}: {name} is {value!r}, not {wanted}")


def _fits(value, types: tuple) -> bool:
    # JSON's true and false are not numbers, nor is a negative count a position in a run.
    if isinstance(value, bool):
        return False
    if isinstance(value, int) and float not in types:
        return int in types and value >= 0
    return isinstance(value, types)


def checked_entry(entry, path: Path) -> Entry:
    """The index entry ``entry`` (from ``path``'s JSON) describes; ValueError when it is not
    one: a field missing or of the wrong type, or a file name not of its kind."""
    where = f"{path} (checkpoint entry)"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: {entry!r} is not an object")
    _check_fields(entry, _ENTRY_TYPES, where, required=("file", "kind"))
    named = parse_checkpoint_name(entry["file"])
    if named is None or named.kind != entry["kind"]:
        raise ValueError(f"{where}: {entry['file']!r} is not the name of a {entry['kind']} file")
    return Entry(**entry)
