"""The ``save_dir`` as one run: opened before anything is built, closed with the run's state.

Opening decides what this process may do with the directory, before it writes a byte: start a
fresh run, resume the run it holds, or nothing at all (that run is finished). Rank 0 decides,
under the directory's lock, and every rank learns the decision, so all of them raise the same
config error or go on together.
"""

import json
import math
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import ignite.distributed as idist
import torch

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run import identity, provenance
from gatle_ignite.run.filesystem import confined, read_confined, remove_quietly, save_dir_error
from gatle_ignite.run.layout import (
    CONFIG_FILE,
    LATEST_ITER_PREFIX,
    LATEST_PREFIX,
    MANIFEST_FILE,
    METRICS_FILE,
    OWNED_LOGS,
    Entry,
    checkpoint_files,
    is_staging,
    parse_checkpoint_name,
)
from gatle_ignite.run.loading import (
    UnreadableCheckpoint,
    VanishedCheckpoint,
    load_checkpoint_file,
    read_origin,
)
from gatle_ignite.run.lock import RunLock
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.run.storage import Place, StorageError, is_url, place_of, staging_dir
from gatle_ignite.utils.dist import rank_zero_print
from gatle_ignite.utils.train_command import under_train_command

__all__ = [
    "Plan",
    "RunDirectory",
    "entry_for",
    "eval_checkpoint",
    "first_loadable",
    "indexed_view",
    "latest_checkpoint",
    "recorded_config",
    "unindexed_files",
]


@dataclass
class Plan:
    """What opening decided; the same on every rank."""

    action: str  # "fresh", "resume", "scratch" or "nothing"
    message: str = ""
    checkpoint: Optional[str] = None
    accepted: list = field(default_factory=list)
    error: Optional[str] = None
    # The resumed run's checkpoint index, so every rank continues the same rotation.
    checkpoints: list = field(default_factory=list)
    # The id of the run this process trains, which its checkpoints record (RunIdentity).
    run_id: Optional[str] = None


def entry_for(path: Path, progress: Optional[tuple] = None) -> Entry:
    """An index entry for a checkpoint on disk, from its name and, when given, its progress."""
    entry = parse_checkpoint_name(path.name)
    if progress is not None:
        epoch, iteration = progress
        entry.epoch = epoch if epoch is not None else entry.epoch
        entry.iteration = iteration if iteration is not None else entry.iteration
    return entry


def _placed(place: Place, name: str, is_dir: bool) -> Optional[Entry]:
    """The entry of a checkpoint in a directory without an index (a 0.4 run, or a damaged
    ``run.json``), where the files are all there is; None when it vanished since it was listed
    (rotated out by a run training there).

    A sharded directory is placed by its name alone: only the checkpoint a command picks has
    its metadata read, through the safe reader.
    """
    if is_dir:
        return entry_for(Path(name))
    try:
        return entry_for(Path(name), read_origin(place.readable(name)).progress)
    except VanishedCheckpoint:
        return None
    except (UnreadableCheckpoint, ConfigError):
        return entry_for(Path(name))


def _run_wrote(place: Place, name: str, manifest: Manifest) -> Optional[Entry]:
    """The entry of a checkpoint the run's index does not list, when it records the run's id:
    the run wrote it and was killed before indexing it. Any other file (copied or planted
    there) is the run's no more than its name says: it is named in a warning and left as it
    is, never ranked, resumed from or adopted. None for those, and for a file that vanished
    since it was listed; one that holds code is refused (``ConfigError``), as anywhere."""
    try:
        origin = read_origin(place.readable(name))
    except VanishedCheckpoint:
        return None
    except UnreadableCheckpoint as error:
        why = f"it does not load ({error.reason})"
    else:
        if origin.run_id == manifest.run_id:
            return entry_for(Path(name), origin.progress)
        why = f"it records {f'run {origin.run_id}' if origin.run_id else 'no run'}"
    warnings.warn(
        f"{place.shown(name)} is no checkpoint of run {manifest.run_id}: its {MANIFEST_FILE} "
        f"does not index "
        f"it and {why}. It is left as it is, never ranked, resumed from or adopted.",
        stacklevel=4,
    )
    return None


def unindexed_files(save_dir, manifest: Manifest) -> list:
    """The names of the checkpoint files in ``save_dir`` that ``manifest`` does not index."""
    indexed = {entry.file for entry in manifest.checkpoints}
    return [name for name in place_of(save_dir).checkpoint_names() if name not in indexed]


def indexed_view(save_dir, manifest: Optional[Manifest], wanted=None) -> list:
    """The index as the files on disk have it: missing files dropped, unlisted ones added.

    Without a manifest every checkpoint file is added; with one, only a file that records the
    run's id (see ``_run_wrote``). ``wanted(entry)``, given, says by its name which unlisted
    file is worth opening to place it; the others are left out unread.
    """
    place = place_of(save_dir)
    on_disk = place.checkpoint_names()
    known = [e for e in (manifest.checkpoints if manifest else []) if e.file in on_disk]
    indexed = {e.file for e in known}
    unlisted = [
        name
        for name in on_disk
        if name not in indexed and (wanted is None or wanted(parse_checkpoint_name(name)))
    ]
    if manifest is None:
        adopted = [_placed(place, name, on_disk[name]) for name in unlisted]
    else:
        adopted = [_run_wrote(place, name, manifest) for name in unlisted]
    return known + [e for e in adopted if e is not None]


def _named_view(save_dir, manifest: Optional[Manifest]) -> list:
    """Every checkpoint file in ``save_dir``, indexed or not, by its index entry or its name:
    what a fresh start refuses to train over, or replaces."""
    known = {e.file: e for e in (manifest.checkpoints if manifest else [])}
    names = place_of(save_dir).checkpoint_names()
    return [known.get(name) or entry_for(Path(name)) for name in names]


def first_loadable(save_dir, entries, map_location="cpu"):
    """``(entry, state)`` of the first entry whose file loads; damaged ones are skipped, loudly,
    and one that is gone (rotated out since it was listed) quietly: it is not there."""
    place = place_of(save_dir)
    for entry in entries:
        try:
            return entry, _load_from(place, entry.file, map_location)
        except VanishedCheckpoint:
            continue
        except UnreadableCheckpoint as error:
            warnings.warn(
                f"skipping {place.shown(entry.file)}, which does not load ({error.reason}); "
                f"trying the next checkpoint.",
                stacklevel=3,
            )
    return None, None


def _load_from(place: Place, name: str, map_location="cpu"):
    """The checkpoint ``name`` of ``place``, its errors naming it where it is kept."""
    try:
        return load_checkpoint_file(place.readable(name), map_location=map_location)
    except VanishedCheckpoint:
        raise
    except UnreadableCheckpoint as error:
        if not place.remote:
            raise
        raise UnreadableCheckpoint(place.shown(name), error.reason) from error


def _arrived(save_dir) -> Place:
    """The place of ``save_dir`` with its records read (from the store, for a URL)."""
    place = place_of(save_dir)
    place.pull_records()
    return place


def latest_checkpoint(save_dir):
    """``(path, state)`` of the furthest-trained resumable checkpoint that loads, or None; for a
    URL the path is the checkpoint's URL."""
    place = _arrived(save_dir)

    def listing() -> list:
        entries = indexed_view(place, _read_manifest(place), wanted=_resumable)
        return sorted((e for e in entries if e.resumable), key=Entry.progress_key, reverse=True)

    return _loaded(place, listing, "latest")


def eval_checkpoint(save_dir, which: str, prefix: str = "valid_"):
    """``(path, state)`` of what ``gatle-ignite eval --ckpt <which>`` loads, or None.

    ``best``: the highest-scoring ``<prefix>best_result*`` file that loads; ``latest``: the
    furthest-trained resumable one; anything else is a path, which must load.
    """
    if which == "latest":
        return latest_checkpoint(save_dir)
    if is_url(which):
        folder, name = which.rstrip("/").rsplit("/", 1)
        return which, _load_named(place_of(folder), name)
    if which != "best":
        path = Path(which)
        if not path.exists():
            raise ConfigError(
                f"--ckpt {which!r} is neither 'best', 'latest' nor an existing checkpoint file."
            )
        if _is_run_directory(path):
            raise _run_directory_error(path, save_dir)
        return path, _load_named(place_of(path.parent), path.name)
    engine = prefix[:-1] if prefix.endswith("_") else prefix
    place = _arrived(save_dir)

    def ours(entry: Entry) -> bool:
        return entry.kind == "best" and entry.engine == engine

    def listing() -> list:
        bests = [e for e in indexed_view(place, _read_manifest(place), ours) if ours(e)]
        bests.sort(key=lambda e: (e.score if e.score is not None else -math.inf, e.progress_key()))
        return list(reversed(bests))

    return _loaded(place, listing, "best")


def _resumable(entry: Entry) -> bool:
    return entry.resumable


def _is_run_directory(path: Path) -> bool:
    """A save_dir (it holds a run's record or its checkpoints), not a sharded checkpoint."""
    if not path.is_dir() or (path / ".metadata").exists():
        return False
    records = (path / MANIFEST_FILE).exists() or (path / CONFIG_FILE).exists()
    return records or bool(checkpoint_files(path))


def _run_directory_error(path: Path, save_dir) -> ConfigError:
    files = sorted(p.name for p in checkpoint_files(path))
    example = f", e.g. --ckpt {path / files[0]}" if files else ""
    if save_dir is not None and path.resolve() == Path(save_dir).resolve():
        choose = "It is this config's save_dir: pass --ckpt best or --ckpt latest"
    else:
        choose = f"Point save_dir at it: --override save_dir={path} --ckpt best (or latest)"
    return ConfigError(
        f"--ckpt {str(path)!r} is a run directory, not a checkpoint.\n"
        f"  {choose}; or name one of its checkpoint files{example}."
    )


# A run training in the directory may rotate out every file of a listing before it is read;
# the files that replaced them are in the next one.
_LISTINGS = 3


def _loaded(place: Place, listing, which: str):
    """The first checkpoint of ``listing()`` that loads; None when there are none, and a config
    error when every one is damaged, which is not the same as a run without checkpoints."""
    for _attempt in range(_LISTINGS):
        entries = listing()
        entry, state = first_loadable(place, entries)
        if entry is not None:
            return _shown_path(place, entry.file), state
        if all(place.exists(e.file) for e in entries):
            break
    if entries:
        where = place.shown()
        raise ConfigError(
            f"no {which!r} checkpoint in {where} can be loaded: the {len(entries)} there are "
            f"damaged (each is named in a warning above).\n"
            f"  Restore a good copy into {where}, or name another checkpoint file "
            f"(gatle-ignite eval --ckpt PATH)."
        )
    return None


def _shown_path(place: Place, name: str):
    """A checkpoint as callers get it: a Path on this machine, the URL on a store (a Path
    would collapse its '//')."""
    return place.shown(name) if place.remote else place.path / name


def _load_named(place: Place, name: str):
    path = place.shown(name)
    try:
        return _load_from(place, name)
    except UnreadableCheckpoint as error:
        raise ConfigError(
            f"cannot load {path}: {error.reason}.\n"
            f"  Point --ckpt at another file, or use --ckpt best / latest, which skip damaged "
            f"files."
        ) from error


def _read_manifest(save_dir) -> Optional[Manifest]:
    place = place_of(save_dir)
    try:
        return Manifest.read(place.path)
    except (ValueError, TypeError) as error:
        warnings.warn(
            f"{place.shown(MANIFEST_FILE)} cannot be read ({error}); rebuilding the run's "
            f"index from the checkpoint files.",
            stacklevel=3,
        )
        return None


class RunDirectory:
    """One run's ``save_dir``: its lock, its manifest, and what this process may do with it.

    ``payload`` is the config as the run records it (JSON, secrets redacted) and ``defaults``
    the framework's defaults the same way, against which a field a newer version added counts
    as unchanged.
    """

    def __init__(self, cfg, payload: dict, defaults: dict):
        self.cfg = cfg
        self.payload = payload
        self.defaults = defaults
        if is_url(cfg.save_dir):
            from gatle_ignite.run.storage.lease import Lease

            # Everything is written in a staging directory here and published to the URL.
            self.place = place_of(cfg.save_dir, local=staging_dir(cfg.save_dir))
            self.lock = Lease(self.place)
            self.place.guard = self.lock.check
        else:
            self.place = place_of(cfg.save_dir)
            self.lock = RunLock(self.place.path)
        self.path = self.place.path
        # How messages name the directory: its path, or its URL.
        self.where = self.place.shown()
        # A trainer built by a script and dropped without fit() lets go of the directory.
        weakref.finalize(self, self.lock.release)
        self.manifest: Optional[Manifest] = None
        self.plan: Optional[Plan] = None
        # Rank 0 keeps the resume checkpoint it loaded while deciding, to load it only once.
        self._loaded = None

    # ---- opening: every rank calls it, rank 0 decides ----

    def open(self) -> Plan:
        plan = None
        if idist.get_rank() == 0:
            try:
                plan = self._decide_plainly()
            except ConfigError as error:
                self.lock.release()
                plan = Plan("refused", error=str(error))
        if idist.get_world_size() > 1:
            shared = [plan]
            torch.distributed.broadcast_object_list(shared, src=0)
            plan = shared[0]
        if plan.error is not None:
            raise ConfigError(plan.error)
        self.plan = plan
        return plan

    def _decide_plainly(self) -> Plan:
        """The decision; a file-system failure under save_dir is the config error saying so."""
        try:
            return self._decide()
        except OSError as error:
            explained = save_dir_error(self.path, error)
            if explained is None:
                raise
            raise explained from error

    def _decide(self) -> Plan:
        self.lock.acquire()
        if self.place.remote:
            self.place.arrive()
        found = _read_manifest(self.path)
        payload = self.payload
        if not self.cfg.resume:
            entries = _named_view(self.place, found)
            beside = self._beside_another_run() if entries else None
            if beside is not None:
                return self._scratch(found, entries, beside)
            if entries:
                self._replace_or_refuse(found, entries)
            return self._start(payload)
        entries = indexed_view(self.place, found)
        if not entries:
            warnings.warn(
                f"resume=True but {self.where} has no {LATEST_PREFIX}* or {LATEST_ITER_PREFIX}* "
                f"checkpoint, so the run starts from scratch.",
                stacklevel=5,
            )
            return self._start(payload)
        # Still "running" while this process holds the lock: its writer died without a word.
        stale = found is not None and found.state == "running"
        return self._resume(self._adopt(found, entries, payload), payload, stale)

    def _beside_another_run(self) -> Optional[str]:
        """Why a fresh run may train beside the run in save_dir, writing nothing there; None
        when it must replace that run or be refused."""
        if self.cfg.get("replace_run", False):
            return None
        if not self.cfg.get("save_ckpt", True):
            return "this run has save_ckpt=False"
        if not under_train_command():
            # 0.4's scripts cannot pass --override: the teacher_student verify script trains
            # in the save_dir of the run it checks.
            return "this fresh run (resume=False) comes from a script's fit()"
        return None

    def _scratch(self, manifest: Optional[Manifest], entries: list, why: str) -> Plan:
        """A run beside the run this save_dir holds, as a 0.4 script trains one to check a task:
        it may train, but it writes nothing here."""
        found = manifest.describe() if manifest else f"{len(entries)} checkpoint(s) of a run"
        warnings.warn(
            f"save_dir {self.where} holds {found}; {why}, so it trains without writing anything "
            f"there (no checkpoint, run.json, config.json, metrics.csv or TensorBoard file), and "
            f"that run stays as it is.",
            stacklevel=5,
        )
        return Plan("scratch")

    def _remove_interrupted_writes(self) -> None:
        for leftover in self.path.iterdir():
            if is_staging(leftover):
                remove_quietly(leftover)
        if self.place.remote:
            self.place.remove_interrupted_writes()

    def _replace_or_refuse(self, manifest: Optional[Manifest], entries: list) -> None:
        found = manifest.describe() if manifest else f"{len(entries)} checkpoint(s) of a run"
        if not self.cfg.get("replace_run", False):
            raise ConfigError(
                f"save_dir {self.where} already holds {found}, and this is a fresh run "
                f"(resume=False).\n"
                f"  Continue that run with --override resume=True, or replace it (deleting its "
                f"checkpoints) with --override replace_run=True, or give this run another "
                f"save_dir."
            )
        for name in [e.file for e in entries] + [MANIFEST_FILE, CONFIG_FILE, *OWNED_LOGS]:
            self.place.remove(name)
        rank_zero_print(f"REPLACED {found} in {self.where}: deleted {len(entries)} checkpoint(s).")

    def _start(self, payload: dict) -> Plan:
        self.manifest = Manifest.new(self.cfg.name, payload, identity.fingerprint(payload))
        self.manifest.max_epochs = self.cfg.max_epochs
        self.manifest.provenance = [provenance.gather("fresh")]
        self._begin()
        return Plan("fresh", run_id=self.manifest.run_id)

    def _begin(self) -> None:
        """Claim the directory for training: what interrupted writes left removed, the files
        the run writes checked, the holder noted, and the state recorded as running, last."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._remove_interrupted_writes()
        for name in (MANIFEST_FILE, CONFIG_FILE, METRICS_FILE):
            _check_writable_name(self.path / name)
        self.manifest.state = "running"
        self.manifest.stop_reason = ""
        self.lock.note_holder()
        self._write_manifest()

    def _write_manifest(self, last_word: bool = False) -> None:
        """Write run.json, and publish it with the records it describes (a remote place)."""
        self.manifest.write(self.path, last_word=last_word)
        self.place.publish_records()

    def _adopt(self, found: Optional[Manifest], entries: list, payload: dict) -> Manifest:
        """The run's manifest, made from its files when it has none (a 0.4 run directory)."""
        if found is None:
            recorded = recorded_config(self.path)
            if recorded is None:
                warnings.warn(
                    f"{self.where} has no record of the config its run was started with, so "
                    f"this resume cannot check what changed.",
                    stacklevel=6,
                )
            config = recorded if recorded is not None else payload
            found = Manifest.new(self.cfg.name, config, identity.fingerprint(config))
        found.checkpoints = entries
        return found

    def _resume(self, manifest: Manifest, payload: dict, stale: bool) -> Plan:
        entry, state = self._resumable_state(manifest)
        accepted = self._check_changes(manifest, payload, _schedule_length(state))
        engine = state.get("trainer", {}) if isinstance(state, dict) else {}
        length = engine.get("epoch_length") or manifest.epoch_length
        iteration = engine.get("iteration", entry.iteration) or 0
        self._check_max_epochs(iteration, length)
        self._loaded = (self.place.shown(entry.file), state)
        finished = self._finished(manifest, payload, iteration, length)
        if finished:
            if stale:
                self._repair(manifest, iteration, length)
            self.lock.release()
            return Plan("nothing", message=finished, checkpoint=self.place.shown(entry.file))
        if accepted:
            manifest.accepted_changes.append({"iteration": iteration, "changes": accepted})
            manifest.config = payload
            manifest.config_fingerprint = identity.fingerprint(payload)
        manifest.name = self.cfg.name
        manifest.max_epochs = self.cfg.max_epochs
        self._record_start(manifest, provenance.gather("resume", iteration))
        self.manifest = manifest
        self._begin()
        return Plan(
            "resume",
            checkpoint=self.place.shown(entry.file),
            accepted=sorted(accepted),
            checkpoints=list(manifest.checkpoints),
            run_id=manifest.run_id,
        )

    def _record_start(self, manifest: Manifest, started: dict) -> None:
        """Add this process to how the run was made, warning when its code is not the code
        the run began with."""
        change = (
            provenance.code_change(manifest.provenance[0], started) if manifest.provenance else None
        )
        if change:
            warnings.warn(
                f"resuming run '{manifest.name}' in {self.where} on other code than it began "
                f"with: {change}. Its weights are trained by both; `gatle-ignite runs "
                f"{self.where} --provenance` shows the code of each start.",
                stacklevel=5,
            )
        manifest.provenance.append(started)

    def _resumable_state(self, manifest: Manifest) -> tuple:
        """``(entry, state)`` to resume from: the furthest-trained resumable checkpoint that
        loads, or else the furthest best file holding a whole training state (a kill or a full
        disk came between an epoch's best and latest writes)."""
        entry, state = first_loadable(self.place, manifest.resumable_newest_first())
        if entry is not None:
            return entry, state
        bests = [e for e in manifest.checkpoints if e.kind == "best"]
        for best in sorted(bests, key=Entry.progress_key, reverse=True):
            entry, state = first_loadable(self.place, [best])
            if entry is not None and "trainer" in state:
                warnings.warn(
                    f"no {LATEST_PREFIX}* or {LATEST_ITER_PREFIX}* checkpoint of the run in "
                    f"{self.where} loads; resuming from its best file {entry.file}, which holds "
                    f"the whole training state at its epoch's end.",
                    stacklevel=6,
                )
                return entry, state
        held = ", ".join(e.file for e in bests) or "none"
        raise ConfigError(
            f"resume=True but no checkpoint in {self.where} can be resumed from: no "
            f"{LATEST_PREFIX}* or {LATEST_ITER_PREFIX}* file loads, and no best file holds a "
            f"training state (best files: {held}; see the warnings above).\n"
            f"  Replace the run with --override resume=False --override replace_run=True "
            f"(model_checkpoint_dir=<a best file> starts it from those weights), or restore a "
            f"checkpoint file."
        )

    def _check_changes(self, manifest: Manifest, payload: dict, built_for) -> dict:
        """The accepted changes, ``{field: [old, new]}``; any other change is refused, and so is
        an accepted name that changes nothing.

        ``built_for`` is the max_epochs the checkpoint's schedule was built for: naming
        ``max_epochs`` refits the schedule to this config's.
        """
        changes = identity.config_changes(manifest.config, payload, self.defaults)
        accept = list(self.cfg.get("accept_changes", []) or [])
        length = built_for if built_for is not None else manifest.max_epochs
        if "max_epochs" in accept and length not in (None, self.cfg.max_epochs):
            changes.append(("max_epochs", length, self.cfg.max_epochs))
        refused = [c for c in changes if not identity.accepted(c[0], accept)]
        if refused:
            listed = "\n".join(f"    {name}: {old!r} -> {new!r}" for name, old, new in refused)
            names = ", ".join(repr(name) for name, _old, _new in refused)
            raise ConfigError(
                f"resume=True, but the config changes what {manifest.describe()} is:\n{listed}\n"
                f"  Put the old values back to resume it, or accept the change with "
                f'--override "accept_changes=[{names}]" (it then takes effect from the '
                f"checkpoint on), or start a new run in another save_dir."
            )
        self._check_accepted_names(manifest, accept, [c[0] for c in changes], length)
        return {name: [old, new] for name, old, new in changes}

    def _check_accepted_names(self, manifest, accept: list, changed: list, length) -> None:
        """Every name in ``accept_changes`` is a field this resume changes (or an earlier resume
        of the run accepted, for a requeued command): a typo or an unchanged field is refused,
        or it would pass for an accepted change that never happened."""
        fields = {*identity.flatten(manifest.config), *identity.flatten(self.payload)}
        earlier = manifest.accepted_before()
        for name in accept:
            covers = [f for f in (*changed, *earlier) if identity.accepted(f, [name])]
            if covers or (name == "max_epochs" and length is None):
                continue
            if name != "max_epochs" and not any(identity.accepted(f, [name]) for f in fields):
                problem = "which is no field of the config (a typo?)"
            elif name != "max_epochs" and identity.operational(name):
                problem = "which a resume may change without accepting it"
            else:
                problem = "but this resume does not change it"
            raise ConfigError(
                f"accept_changes names {name!r}, {problem}.\n"
                f"  Name only fields whose change you accept (a field such as "
                f"'optimizer_params.lr' or a group such as 'model_params'), or leave "
                f"accept_changes out."
            )

    def _check_max_epochs(self, iteration: int, length: Optional[int]) -> None:
        if not length:
            return
        reached = math.ceil(iteration / length)
        if self.cfg.max_epochs < reached:
            raise ConfigError(
                f"max_epochs={self.cfg.max_epochs}, but the run in {self.where} already trained "
                f"into epoch {reached} (iteration {iteration}).\n"
                f"  Resume with max_epochs >= {reached}, or start a new run from its weights "
                f"in another save_dir with model_checkpoint_dir=<one of its checkpoints>."
            )

    def _finished(self, manifest, payload, iteration, length) -> Optional[str]:
        """Why there is nothing to train, or None when the resume has work to do."""
        if manifest.state == "pruned":
            return (
                f"NOTHING TO DO: the run in {self.where} was pruned by its sweep "
                f"({manifest.stop_reason}), which makes it finished.{_best_line(manifest)}\n"
                f"  To train it further, start a new run from its weights in another save_dir "
                f"with model_checkpoint_dir=<its latest checkpoint>."
            )
        if not length or iteration % length:
            return None
        epochs = iteration // length
        best = _best_line(manifest)
        if epochs >= self.cfg.max_epochs:
            return (
                f"NOTHING TO DO: the run in {self.where} has trained all {epochs} of its "
                f"max_epochs.{best}\n  Raise max_epochs to train it further; the learning-rate "
                f"schedule keeps its length unless you add "
                f"--override \"accept_changes=['max_epochs']\"."
            )
        if manifest.state == "early-stopped" and not _patience_changed(manifest.config, payload):
            return (
                f"NOTHING TO DO: the run in {self.where} stopped early at epoch {epochs} "
                f"({manifest.stop_reason}).{best}\n"
                f"  Raise early_stop_patience (or set it to 0) to train it further."
            )
        return None

    def _repair(self, manifest: Manifest, iteration: int, length: int) -> None:
        """Record the end of a run found finished but still "running": its process was killed
        after its last checkpoint, before it could say so."""
        manifest.state, manifest.stop_reason = "completed", ""
        manifest.max_epochs = self.cfg.max_epochs
        manifest.epoch_length = length
        manifest.trained_iteration, manifest.trained_epoch = iteration, iteration // length
        where = self.place.shown(MANIFEST_FILE)
        try:
            manifest.write(self.path)
            self.place.publish_records()
        except (OSError, ConfigError, StorageError) as error:
            warnings.warn(
                f"{where} still says the run is running, and cannot be corrected ({error}).",
                stacklevel=6,
            )
            return
        rank_zero_print(
            f"REPAIRED {where}: state running -> completed (its process ended after the last "
            f"checkpoint without recording it)."
        )

    # ---- the resumed checkpoint ----

    def resume_checkpoint(self):
        """``(path, state)`` of the checkpoint this run resumes from (or, finished, ended on);
        None for a fresh run."""
        if self.plan is None or self.plan.checkpoint is None:
            return None
        if self._loaded is not None:
            loaded, self._loaded = self._loaded, None
            return loaded
        checkpoint = self.plan.checkpoint
        name = checkpoint.rsplit("/", 1)[-1] if self.place.remote else Path(checkpoint).name
        return checkpoint, _load_from(self.place, name)

    # ---- while training: the index (rank 0) ----

    def record_saved(self, filename: str, metadata: dict, removed: list, trainer) -> None:
        state = trainer.state
        entry = entry_for(self.path / filename, (state.epoch, state.iteration))
        if entry.kind == "best" and "priority" in metadata:
            entry.score = float(metadata["priority"])
        self.manifest.record(entry, removed)
        self._note_progress(trainer)
        self._write_manifest()

    def shown(self, checkpoint) -> Optional[str]:
        """How a message names a checkpoint file this run wrote (its URL, on a store)."""
        return self.place.shown(Path(checkpoint).name) if checkpoint else checkpoint

    def note_lr_groups(self, names: list) -> None:
        """Record the param groups' names (rank 0), written with the run's next record."""
        if self.manifest is not None:
            self.manifest.lr_groups = list(names)

    def entries(self, kind: str, engine: str = "") -> list:
        """The run's checkpoints of a kind, on every rank (a sharded save involves them all)."""
        known = self.plan.checkpoints if self.plan is not None else []
        return [e for e in known if e.kind == kind and e.engine == engine]

    def _note_progress(self, trainer) -> None:
        state = trainer.state
        self.manifest.epoch_length = state.epoch_length or self.manifest.epoch_length
        if state.iteration >= self.manifest.trained_iteration:
            self.manifest.trained_iteration = state.iteration
            self.manifest.trained_epoch = state.epoch

    # ---- closing ----

    def record_end(self, state: str, reason: str = "", trainer=None) -> None:
        """Record how the run ended (rank 0). Done before the slow part of a teardown, and
        written in place when the disk is too full for a new file: a process killed while its
        backends close, or one that saw its disk fill, never leaves the run "running"."""
        if idist.get_rank() != 0 or self.manifest is None:
            return
        self.manifest.state = state
        self.manifest.stop_reason = reason
        if trainer is not None:
            self._note_progress(trainer)
        if state in ("completed", "early-stopped"):
            self._drop_recovered_interruptions()
        self._write_manifest(last_word=True)

    def release(self) -> None:
        """Let the next process in."""
        self.lock.release()

    def _drop_recovered_interruptions(self) -> None:
        """Delete a finished run's iteration checkpoints that an interruption wrote (not the
        ``save_every_iters`` cadence, which ``n_saved`` keeps) and that an epoch checkpoint
        has overtaken: the run recovered from them, and no resume would choose them again."""
        entries = self.manifest.checkpoints
        epochs = [e.iteration for e in entries if e.kind == LATEST_PREFIX and e.iteration]
        if not epochs:
            return
        every = self.cfg.get("save_every_iters", 0) or 0
        stale = [
            e
            for e in entries
            if e.kind == LATEST_ITER_PREFIX
            and e.iteration is not None
            and e.iteration <= max(epochs)
            and not (every and e.iteration % every == 0)
        ]
        for entry in stale:
            self.place.remove(entry.file)
        self.manifest.forget(entry.file for entry in stale)


def _check_writable_name(path: Path) -> None:
    """Refuse, before the run writes a byte, a name it writes that cannot be written: a link
    out of save_dir, or a directory where its file goes."""
    confined(path)
    if path.is_dir() and not path.is_symlink():
        raise ConfigError(
            f"{path} is a directory, where the run keeps its {path.name} file.\n"
            f"  Move that directory out of {path.parent}, or give the run another save_dir."
        )


def _schedule_length(state) -> Optional[int]:
    """The max_epochs a checkpoint's learning-rate schedule was built for, when it says."""
    meta = state.get("run_meta") if hasattr(state, "get") else None
    length = meta.get("max_epochs") if isinstance(meta, dict) else None
    return length if isinstance(length, int) else None


def recorded_config(save_dir: Path) -> Optional[dict]:
    """The run's ``config.json`` (read as a run directory's files are); None when unreadable."""
    try:
        recorded = json.loads(read_confined(save_dir / CONFIG_FILE))
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _patience_changed(old: dict, new: dict) -> bool:
    before, after = identity.flatten(old), identity.flatten(new)
    names = {n for n in (*before, *after) if n.endswith("early_stop_patience")}
    return any(before.get(n) != after.get(n) for n in names)


def _best_line(manifest: Manifest) -> str:
    bests = [e for e in manifest.checkpoints if e.kind == "best" and e.score is not None]
    if not bests:
        return ""
    top = max(bests, key=lambda e: (e.score, e.iteration or 0))
    return f" Best: {top.file} (epoch {top.epoch})."
