"""A run directory at an fsspec URL: the local directory mirrored to it, file by finished file.

Publishing a file makes it whole at the URL or not at all: on an object store (S3, GCS, Azure)
an upload becomes visible only once complete, so it goes straight to its key; elsewhere it is
uploaded under a staging name and moved into place. A checkpoint read from the URL is fetched
into the local directory once, and fetched again only when the object changed (its tag).
Nothing is ever deleted or written outside the URL's prefix: every name is one path component.

The only module besides the sharded checkpoints' reader that imports fsspec.
"""

import contextlib
import hashlib
import json
import os
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.redaction import redact_text
from gatle_ignite.run.layout import (
    CONFIG_FILE,
    LEASE_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    OWNED_LOGS,
    checkpoint_files,
    is_staged_name,
    parse_checkpoint_name,
    staging_path,
)
from gatle_ignite.run.storage.place import Place, StorageError

__all__ = ["ATTEMPTS", "OBJECT_STORES", "RemotePlace", "sharded_io", "upload_command"]

try:
    import fsspec
    from fsspec.core import url_to_fs
except ImportError:  # the cloud extra is not installed
    fsspec = None

# Stores whose uploads appear whole or not at all, so a file goes straight to its key.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oci"})
# Each storage call is tried this often, BACKOFF seconds apart and then twice that; the
# fsspec client retries its own transient errors (throttling included) within each try.
ATTEMPTS, BACKOFF = 3, 1.0
# A try that has not returned after this many seconds (GATLE_IGNITE_STORAGE_TIMEOUT), plus one
# second per MIN_RATE bytes it sends, has failed: a client can wait on a stalled endpoint for
# good (aiohttp waits for S3's "100 Continue" without a timeout).
TIMEOUT_VAR, TIMEOUT_SECONDS, MIN_RATE = "GATLE_IGNITE_STORAGE_TIMEOUT", 120.0, 2**20
# The local record of which version of each fetched or published object a file holds.
_TAGS_FILE = ".gatle-tags.json"
# Memory stores live in this process: one lock makes their conditional writes atomic.
_MEMORY_LOCK = threading.Lock()
# On a store without conditional writes, a lease written is read back after this long.
VERIFY_SECONDS = 2.0


def sharded_io() -> SimpleNamespace:
    """DCP's fsspec writer and reader, through which every rank writes and reads its own
    shards of a sharded checkpoint at a URL."""
    if fsspec is None:
        raise _missing_extra("the", ImportError("no module named 'fsspec'"))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    return SimpleNamespace(writer=FsspecWriter, reader=FsspecReader)


def _seconds() -> float:
    try:
        return max(float(os.environ.get(TIMEOUT_VAR, TIMEOUT_SECONDS)), 1.0)
    except ValueError:
        return TIMEOUT_SECONDS


def _missing_extra(protocol: str, error: Exception) -> ConfigError:
    return ConfigError(
        f"save_dir is a {protocol}:// URL, and its storage package is not installed "
        f"({error}).\n"
        f'  Install the cloud extra: pip install "gatle-ignite[cloud]" (S3; for gs:// add '
        f"gcsfs, for az:// adlfs)."
    )


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return redact_text(f"{type(error).__name__}: {text.splitlines()[0][:300]}")


def upload_command(local: Path, url: str) -> str:
    """The command that publishes what a run left in its staging directory."""
    return f"python -m gatle_ignite.run.storage {local} {url}"


class RemotePlace(Place):
    """``url``, with ``local`` the directory its files are written to and read from."""

    remote = True

    def __init__(self, url: str, local: Path):
        self.url = url.rstrip("/")
        self.protocol = self.url.split("://", 1)[0].lower()
        self.path = Path(local)
        if fsspec is None:
            raise _missing_extra(self.protocol, ImportError("no module named 'fsspec'"))
        try:
            self.fs, self.root = url_to_fs(self.url)
        except (ImportError, ValueError) as error:
            raise _missing_extra(self.protocol, error) from error
        self.root = self.root.rstrip("/")
        self._published_logs: dict = {}
        self._published_records: dict = {}
        # Called before every write: the writing run's lease check.
        self.guard: Callable = lambda: None

    # ---- names ----

    def shown(self, name: str = "") -> str:
        return f"{self.url}/{name}" if name else self.url

    def key(self, name: str) -> str:
        """The store's path of ``name``: one component inside the prefix, never outside."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a name inside {self.url}")
        return f"{self.root}/{name}"

    # ---- calls, retried ----

    def call(self, what: str, function: Callable, *args, size: int = 0, **kwargs):
        """``function(*args)``, tried ATTEMPTS times, each within its time (``size``: the bytes
        it sends); a missing object is the caller's to handle, anything else ends in a
        StorageError naming ``what`` failed."""
        if getattr(self.fs, "async_impl", False):
            # fsspec's blocking wrappers of an async client take the limit themselves.
            kwargs["timeout"] = _seconds() + size / MIN_RATE
        for attempt in range(ATTEMPTS):
            try:
                return function(*args, **kwargs)
            except (FileNotFoundError, FileExistsError):
                raise
            except (TypeError, AttributeError) as error:
                # Not the store's answer: its client was given options it does not take.
                raise ConfigError(
                    f"the client of {self.url} cannot {what}: {_reason(error)}.\n"
                    f"  Check the options given to it (FSSPEC_{self.protocol.upper()}_* "
                    f"environment variables)."
                ) from None
            except PermissionError as error:
                raise StorageError(
                    f"{self.url} refused to {what}: {_reason(error)}.\n"
                    f"  Check the credentials and permissions this machine uses for it."
                ) from None
            except Exception as error:  # the store's clients raise their own kinds
                if attempt + 1 == ATTEMPTS:
                    raise StorageError(
                        f"{self.url} did not answer: {what} failed {ATTEMPTS} times, the last "
                        f"with {_reason(error)}."
                    ) from None
                time.sleep(BACKOFF * 2**attempt)
        raise AssertionError("unreachable")

    def _fresh(self) -> None:
        """Forget the client's listings, which another process may have changed."""
        self.fs.invalidate_cache()

    # ---- listing and reading ----

    def entries(self) -> dict:
        """``{name: is_directory}`` of everything directly under the prefix."""
        self._fresh()
        try:
            listed = self.call("list", self.fs.ls, self.root, detail=True)
        except FileNotFoundError:
            return {}
        found = {}
        for item in listed:
            name = item["name"].rstrip("/").rsplit("/", 1)[-1]
            if name:
                found[name] = item.get("type") == "directory"
        return found

    def names(self):
        """What the prefix holds, the lease aside; None when it holds nothing."""
        names = [name for name in self.entries() if name != LEASE_FILE]
        return names or None

    def runs_below(self) -> list:
        """The URL itself when it holds a run (a run.json or a checkpoint), else the URLs of
        every run below it."""
        if MANIFEST_FILE in self.entries() or self.checkpoint_names():
            return [self.url]
        self._fresh()
        found = self.call("list", self.fs.find, self.root)
        tail = "/" + MANIFEST_FILE
        prefixes = sorted({key[: -len(tail)] for key in found if key.endswith(tail)})
        base = self.url[: len(self.url) - len(self.root)] if self.root else self.url + "/"
        return [f"{base}{prefix}" for prefix in prefixes]

    def checkpoint_names(self) -> dict:
        return {n: d for n, d in self.entries().items() if parse_checkpoint_name(n) is not None}

    def exists(self, name: str) -> bool:
        self._fresh()
        return bool(self.call(f"look for {name}", self.fs.exists, self.key(name)))

    def read_bytes(self, name: str) -> Optional[bytes]:
        try:
            return self.call(f"read {name}", self.fs.cat_file, self.key(name))
        except FileNotFoundError:
            return None

    def tag(self, name: str) -> Optional[str]:
        """What identifies the object's current version (its ETag, else size and time)."""
        info = self._info(name)
        return _tag_of(info) if info is not None else None

    def size(self, name: str) -> Optional[int]:
        """The object's size in bytes; None when there is no such object."""
        info = self._info(name)
        return int(info.get("size") or 0) if info is not None else None

    def _info(self, name: str) -> Optional[dict]:
        self._fresh()
        try:
            return self.call(f"look at {name}", self.fs.info, self.key(name))
        except FileNotFoundError:
            return None

    def readable(self, name: str):
        if name.endswith(".dcp"):
            return self.shown(name)
        return self.fetch(name)

    def fetch(self, name: str) -> Path:
        """The local copy of ``name``, downloaded unless the one there is that version; a
        name gone from the store gives a path that does not exist."""
        local = self.path / name
        info = self._info(name)
        if info is None:
            return local
        tag = _tag_of(info)
        tags = self._tags()
        if local.is_file() and tags.get(name) == tag:
            return local
        self.path.mkdir(parents=True, exist_ok=True)
        staging = staging_path(local, uuid.uuid4().hex[:8])
        try:
            self.call(
                f"download {name}",
                self.fs.get_file,
                self.key(name),
                str(staging),
                size=info.get("size") or 0,
            )
            os.replace(staging, local)
        except FileNotFoundError:
            return local
        finally:
            staging.unlink(missing_ok=True)
        self._remember(name, tag)
        return local

    # ---- publishing ----

    def publish(self, name: str, same_as: Optional[str] = None) -> None:
        local = self.path / name
        try:
            self.guard()
            if same_as is not None and self._tags().get(same_as) == self.tag(same_as):
                # The same bytes are there already: the store copies them, nothing is sent.
                source = self.key(same_as)
                self._atomically(name, lambda key, **kw: self.fs.copy(source, key, **kw))
            else:
                self._atomically(
                    name,
                    lambda key, **kw: self.fs.put_file(str(local), key, **kw),
                    size=local.stat().st_size,
                )
            self._remember(name, self.tag(name))
        except StorageError as error:
            raise StorageError(
                f"{error}\n  The checkpoint {name} is safe on this machine, in {self.path}.\n"
                f"  Once {self.url} answers again, resume on this machine (resume=True "
                f"publishes it first), or publish it from here: "
                f"{upload_command(self.path, self.url)}"
            ) from None

    def publish_bytes(self, name: str, data: bytes) -> None:
        self.guard()
        self._atomically(name, lambda key, **kw: self.fs.pipe_file(key, data, **kw), size=len(data))

    def _atomically(self, name: str, write: Callable, size: int = 0) -> None:
        """``write(key, **limits)`` so that ``name`` appears whole or not at all."""
        if self.protocol in OBJECT_STORES:
            self.call(f"upload {name}", write, self.key(name), size=size)
            return
        # A file system (not an object store) needs the prefix's directory made first.
        self.call("make its directory", self.fs.makedirs, self.root, exist_ok=True)
        staged = self.key(staging_path(Path(name), uuid.uuid4().hex[:8]).name)
        try:
            self.call(f"upload {name}", write, staged, size=size)
            self.call(f"move {name} into place", self.fs.mv, staged, self.key(name))
        finally:
            with contextlib.suppress(Exception):
                if self.fs.exists(staged):
                    self.fs.rm(staged)

    def publish_records(self) -> None:
        """The logs (metrics.csv up to its last whole row; the files of TensorBoard and the
        profiler that changed), config.json when it changed, then run.json, last."""
        self._publish_new_logs()
        for name in (METRICS_FILE, CONFIG_FILE, MANIFEST_FILE):
            local = self.path / name
            data = _whole_rows(local) if name == METRICS_FILE else _read(local)
            if data is None:
                continue
            digest = hashlib.sha256(data).hexdigest()
            if self._published_records.get(name) != digest:
                self.publish_bytes(name, data)
                self._published_records[name] = digest

    def _publish_new_logs(self) -> None:
        for folder in OWNED_LOGS:
            top = self.path / folder
            if folder == METRICS_FILE or not top.is_dir():
                continue
            for file in sorted(p for p in top.rglob("*") if p.is_file()):
                relative = file.relative_to(self.path).as_posix()
                stat = file.stat()
                stamp = (stat.st_size, stat.st_mtime_ns)
                if self._published_logs.get(relative) == stamp:
                    continue
                key = f"{self.root}/{relative}"
                self.call(f"upload {relative}", self.fs.put_file, str(file), key, size=stat.st_size)
                self._published_logs[relative] = stamp

    def pull_records(self) -> None:
        """run.json, config.json and metrics.csv as the store has them, in the local
        directory; a local one the store lacks is removed."""
        self.path.mkdir(parents=True, exist_ok=True)
        for name in (MANIFEST_FILE, CONFIG_FILE, METRICS_FILE):
            data = self.read_bytes(name)
            local = self.path / name
            if data is None:
                local.unlink(missing_ok=True)
                continue
            staging = staging_path(local, uuid.uuid4().hex[:8])
            staging.write_bytes(data)
            os.replace(staging, local)
            self._published_records[name] = hashlib.sha256(data).hexdigest()

    def arrive(self) -> None:
        """Make the staging directory the run at the URL, before a run decides what to do: what
        an earlier process of that same run left here unpublished is published first (see
        :meth:`push_leftovers`); whatever else it held is dropped."""
        if self.holds_the_same_run():
            self.push_leftovers()
        else:
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)
        self.pull_records()

    def holds_the_same_run(self) -> bool:
        """Whether the staging directory's run.json is of the run the URL's records (its id)."""
        mine = _run_of(_read(self.path / MANIFEST_FILE))
        theirs = _run_of(self.read_bytes(MANIFEST_FILE))
        return mine is not None and theirs is not None and mine["run_id"] == theirs["run_id"]

    def push_leftovers(self) -> list:
        """Publish what an earlier process of the run left here unpublished (the store was
        down): the checkpoints the store lacks, then the records when they are further along.
        Returns the names published."""
        there = self.checkpoint_names()
        pushed = []
        for file in checkpoint_files(self.path):
            if file.name not in there and file.is_file():
                self.publish(file.name)
                pushed.append(file.name)
        mine = _run_of(_read(self.path / MANIFEST_FILE)) or {}
        theirs = _run_of(self.read_bytes(MANIFEST_FILE)) or {}
        if mine.get("trained_iteration", 0) > theirs.get("trained_iteration", 0):
            self._published_records.clear()
            self.publish_records()
            pushed.append(MANIFEST_FILE)
        return pushed

    def remove_interrupted_writes(self) -> None:
        """Delete the staging names a killed upload or sharded save left at the URL."""
        for name in self.entries():
            if is_staged_name(name):
                self.remove(name)

    def move_directory(self, staged: str, name: str) -> None:
        """Put the sharded checkpoint written under ``staged`` in place as ``name``: a reader
        finds its ``.metadata`` only once every shard is there. A directory of that name
        already there goes first, its metadata before the rest."""
        self.guard()
        self._fresh()
        source = self.key(staged)
        files = self.call(f"list {staged}", self.fs.find, source)
        with contextlib.suppress(FileNotFoundError):
            self.call(f"delete {name}", self.fs.rm, f"{self.key(name)}/.metadata")
        self.remove(name)
        last = [f for f in files if f.endswith("/.metadata")]
        for file in [f for f in files if f not in last] + last:
            target = self.key(name) + file[len(source) :]
            self.call(f"move {name}", self.fs.copy, file, target)
        self.remove(staged)

    def remove(self, name: str) -> None:
        """Delete ``name`` here and at the URL (a sharded checkpoint: every object under it)."""
        local = self.path / name
        with contextlib.suppress(FileNotFoundError):
            if local.is_dir() and not local.is_symlink():
                import shutil

                shutil.rmtree(local, ignore_errors=True)
            else:
                local.unlink()
        key = self.key(name)
        self.guard()
        self._fresh()
        with contextlib.suppress(FileNotFoundError):
            self.call(f"delete {name}", self.fs.rm, key, recursive=True)
        tags = self._tags()
        if tags.pop(name, None) is not None:
            self._write_tags(tags)

    # ---- conditional writes: the lease's primitive ----

    @property
    def conditional(self) -> bool:
        """Whether the store writes on a condition (S3's If-None-Match / If-Match, or a
        memory store, which lives in this process)."""
        return self.protocol in ("s3", "s3a", "memory")

    def read_tagged(self, name: str) -> Optional[tuple]:
        """``(bytes, tag)`` of ``name``, or None; the tag read first, so a write between the
        two makes a later conditional write with it fail rather than succeed wrongly."""
        tag = self.tag(name)
        data = self.read_bytes(name) if tag is not None else None
        if data is None:
            return None
        return data, (hashlib.sha256(data).hexdigest() if self.protocol == "memory" else tag)

    def create(self, name: str, data: bytes) -> Optional[str]:
        """Write ``name`` only if it does not exist; its tag, or None when it did."""
        if self.protocol == "memory":
            with _MEMORY_LOCK:
                if self.fs.exists(self.key(name)):
                    return None
                self.fs.pipe_file(self.key(name), data)
            return hashlib.sha256(data).hexdigest()
        if self.conditional:
            return self._s3_put(name, data, IfNoneMatch="*")
        return self._verified(name, data, expected=None)

    def replace(self, name: str, data: bytes, tag: str) -> Optional[str]:
        """Write ``name`` only if it is still the version ``tag``; the new tag, or None."""
        if self.protocol == "memory":
            with _MEMORY_LOCK:
                current = self.read_bytes(name)
                if current is None or hashlib.sha256(current).hexdigest() != tag:
                    return None
                self.fs.pipe_file(self.key(name), data)
            return hashlib.sha256(data).hexdigest()
        if self.conditional:
            return self._s3_put(name, data, IfMatch=tag)
        return self._verified(name, data, expected=tag)

    def _s3_put(self, name: str, data: bytes, **condition) -> Optional[str]:
        bucket, key, _ = self.fs.split_path(self.key(name))
        try:
            answer = self.call(
                f"write {name}",
                self.fs.call_s3,
                "put_object",
                Bucket=bucket,
                Key=key,
                Body=data,
                **condition,
            )
        except (FileExistsError, FileNotFoundError):
            return None
        except StorageError as error:
            if "pre-condition" in str(error) or "PreconditionFailed" in str(error):
                return None
            raise
        self._fresh()
        return answer.get("ETag")

    def _verified(self, name: str, data: bytes, expected: Optional[str]) -> Optional[str]:
        """A conditional write where the store has none: check, write, wait, read back. Two
        writers racing within VERIFY_SECONDS of each other are told apart by the read-back;
        the lease's documentation says what this cannot promise."""
        found = self.read_tagged(name)
        if (found is None) != (expected is None) or (found and found[1] != expected):
            return None
        self.publish_bytes(name, data)
        time.sleep(VERIFY_SECONDS)
        back = self.read_tagged(name)
        return back[1] if back is not None and back[0] == data else None

    # ---- the local record of versions ----

    def _tags(self) -> dict:
        try:
            tags = json.loads((self.path / _TAGS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return tags if isinstance(tags, dict) else {}

    def _write_tags(self, tags: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / _TAGS_FILE
        staging = staging_path(target, uuid.uuid4().hex[:8])
        staging.write_text(json.dumps(tags), encoding="utf-8")
        os.replace(staging, target)

    def _remember(self, name: str, tag: Optional[str]) -> None:
        tags = self._tags()
        tags[name] = tag
        self._write_tags(tags)


def _read(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None


def _tag_of(info: dict) -> str:
    for field in ("ETag", "etag", "md5Hash", "generation"):
        if info.get(field):
            return str(info[field])
    stamp = info.get("LastModified") or info.get("mtime") or info.get("created")
    return f"{info.get('size')}:{stamp}"


def _run_of(data: Optional[bytes]) -> Optional[dict]:
    """The run id and progress a run.json's bytes record, or None."""
    try:
        record = json.loads(data.decode("utf-8")) if data else None
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        return None
    return record


def _whole_rows(path: Path) -> Optional[bytes]:
    """A file being appended to, up to its last complete line."""
    data = _read(path)
    if data is None:
        return None
    return data[: data.rfind(b"\n") + 1]
