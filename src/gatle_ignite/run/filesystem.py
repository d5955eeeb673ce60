"""``save_dir`` on its file system: writes and reads that never leave it, and its failures told
plainly.

A name in ``save_dir`` that is a symbolic link to somewhere outside it is never written
through: the write is refused, naming the link. A file-system failure under ``save_dir`` (read
only, a parent that is a file, a name too long, a full disk) becomes one ``ConfigError`` that
says what is wrong and what to do, instead of a traceback from deep inside a write.

A run directory is often someone else's (a colleague's copy, a shared disk), so what is read
from it is read as :func:`read_confined` reads: a regular file only (never a FIFO, which would
wait forever, nor a device such as ``/dev/zero``, which never ends), no larger than a bound,
and never through a link that leads out of the directory.
"""

import contextlib
import errno
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Optional

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run.layout import staging_path

__all__ = [
    "RECORD_LIMIT",
    "UnsafeFile",
    "confined",
    "leads_out",
    "open_confined",
    "open_regular",
    "read_confined",
    "remove_quietly",
    "save_dir_error",
    "write_atomically",
    "writing_into",
]

# Below this much free space a write that failed without saying why (torch's archive writer
# reports only "unexpected pos") is taken to have run out of it.
_NEARLY_FULL = 1 << 20

_WHY = {
    errno.EROFS: "it is on a read-only file system",
    errno.EACCES: "this user may not write there",
    errno.EPERM: "this user may not write there",
    errno.ENOSPC: "its file system has no space left",
    errno.EDQUOT: "this user's disk quota is used up",
    errno.ENAMETOOLONG: "a name on its path is longer than the file system allows",
    errno.ENOTDIR: "a name on its path is a file, not a directory",
    errno.EEXIST: "a name on its path is a file, not a directory",
    errno.ELOOP: "its path goes round a loop of symbolic links",
}
_SPACE = (errno.ENOSPC, errno.EDQUOT)


# The most a run's own records (run.json, config.json, sweep.json, run.lock) are read up to: far
# above any real one (a run.json indexing 10,000 checkpoints is about 2 MB), and the bound on
# what a planted one costs. A larger file is treated as a damaged one.
RECORD_LIMIT = 16 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


class UnsafeFile(ValueError):
    """A file that is not read: a link out of its directory, not a regular file, or too large.

    Its message says which, without the path, which the caller names.
    """


def leads_out(path: Path) -> Optional[Path]:
    """Where ``path`` leads when it is a symbolic link out of its directory; None otherwise."""
    if not path.is_symlink():
        return None
    directory = path.parent.resolve()
    # realpath, unlike resolve, answers for a loop of links too (which then fails to open).
    target = Path(os.path.realpath(path))
    if target == directory or directory in target.parents:
        return None
    return target


def confined(path) -> Path:
    """``path``, once sure that writing it stays inside its directory.

    A symbolic link there whose target lies outside that directory is refused with a
    ``ConfigError`` naming both: writing through it would change a file this run does not own.
    """
    path = Path(path)
    target = leads_out(path)
    if target is None:
        return path
    raise ConfigError(
        f"{path} is a symbolic link to {target}, outside {path.parent}: gatle-ignite never "
        f"writes through it, so that a file it does not own is never changed.\n"
        f"  Remove the link (or move the file it points to into {path.parent})."
    )


def open_confined(path, mode: str, **options):
    """``open(path, mode)`` for writing, refused when ``path`` leads out of its directory."""
    return open(confined(path), mode, **options)


def open_regular(path, limit: int = RECORD_LIMIT):
    """``path`` opened for reading in binary, once sure it is a regular file of at most
    ``limit`` bytes inside its directory; raises ``UnsafeFile`` when it is not, and
    ``FileNotFoundError`` when there is none.

    Opened without waiting (a FIFO would block until something writes to it) and checked on
    the open file, so what is checked is what is read.
    """
    path = Path(path)
    target = leads_out(path)
    if target is not None:
        raise UnsafeFile(f"it is a symbolic link to {target}, outside {path.parent}")
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            kind = next((kind for test, kind in _KINDS if test(info.st_mode)), "something else")
            raise UnsafeFile(f"it is {kind}, not a regular file")
        if info.st_size > limit:
            raise UnsafeFile(_too_large(info.st_size, limit))
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_confined(path, limit: int = RECORD_LIMIT) -> bytes:
    """The bytes of ``path``, read as :func:`open_regular` opens it, never more than ``limit``."""
    with open_regular(path, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:  # it grew since it was opened
        raise UnsafeFile(_too_large(len(data), limit))
    return data


def _too_large(size: int, limit: int) -> str:
    return f"it holds {size} bytes, more than the {limit >> 20} MiB read of such a file"


def write_atomically(path, text: str, when_full: Optional[str] = None) -> None:
    """Write ``text`` to ``path`` so that a kill at any moment leaves the old file or the new.

    Not fsynced, as the checkpoints are not: a killed process loses nothing the kernel holds,
    and an fsync per checkpoint costs milliseconds the loop would wait for (bench.train_step);
    a power cut is what the start's reconciliation of the index with the files is for.

    ``when_full``: on a disk too full for a new file, this (shorter) text is written over the
    old file, in the blocks it already holds, when it fits there: the last word of a run that
    is failing, for which a torn file (the rebuildable worst case) beats a stale one.
    """
    path = confined(path)
    staging = staging_path(path, uuid.uuid4().hex[:8])
    with writing_into(path.parent):
        try:
            with open(staging, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as error:
            staging.unlink(missing_ok=True)
            if when_full is None or error.errno not in _SPACE or not _overwrite(path, when_full):
                raise
            return
        os.replace(staging, path)


def _overwrite(path: Path, text: str) -> bool:
    """Write ``text`` over ``path`` within the space the file already holds; False when it
    does not fit (or there is no such file)."""
    data = text.encode("utf-8")
    try:
        with open(path, "r+b") as handle:
            if len(data) > os.fstat(handle.fileno()).st_blocks * 512:
                return False
            handle.write(data)
            handle.truncate()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def writing_into(save_dir):
    """Around a write into ``save_dir``: a file-system failure becomes the ``ConfigError`` that
    explains it."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        explained = save_dir_error(save_dir, error)
        if explained is None:
            raise
        raise explained from error


def save_dir_error(save_dir, error: BaseException) -> Optional[ConfigError]:
    """The ``ConfigError`` that tells what ``error`` means for ``save_dir``; None when it is not a
    file-system problem of ``save_dir``'s.

    A ``RuntimeError`` (torch's archive writer says only "unexpected pos") is one when the file
    system is full or read-only as it is raised.
    """
    code = getattr(error, "errno", None)
    if code not in _WHY and isinstance(error, RuntimeError):
        code = _unsaid(_existing(save_dir))
    if code not in _WHY:
        return None
    # A path above save_dir says where the problem is; a file in it (a staging name) does not.
    failed = getattr(error, "filename", None)
    above = failed and Path(save_dir).absolute() not in (Path(failed).absolute().parents)
    where = f" ({failed})" if above and Path(failed) != Path(save_dir) else ""
    if code in _SPACE:
        fix = "Free some space (or give the run a save_dir elsewhere), then resume=True."
    else:
        fix = "Give the run a save_dir it can write, or fix that path's permissions or mount."
    return ConfigError(f"cannot write save_dir {save_dir}{where}: {_WHY[code]}.\n  {fix}")


def _unsaid(directory: Path) -> Optional[int]:
    """The errno a write into ``directory`` most likely failed with, from its file system's
    state: out of space, or read-only; None when neither."""
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    if stats.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if stats.f_bavail * stats.f_frsize < _NEARLY_FULL:
        return errno.ENOSPC
    return None


def _existing(path) -> Path:
    """``path`` or its nearest ancestor that exists, to ask its file system about space."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def remove_quietly(path: Path) -> None:
    """Delete a file or directory that is ours; a symbolic link is removed, never followed."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
