"""The output directory: written under a staging name beside it, renamed into place only once
every check passed, so a failed or killed export never leaves a half-written ``DIR``."""

import contextlib
import os
import shutil
import uuid
from pathlib import Path

from gatle_ignite.dispatch import ConfigError

__all__ = ["check_out_dir", "publish", "staged"]


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse a ``DIR`` that is a file, or a non-empty directory without ``force``."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; export writes a directory. Name another path.")
    if out.is_dir() and any(out.iterdir()) and not force:
        held = ", ".join(sorted(path.name for path in out.iterdir()))
        raise ConfigError(
            f"--out {out} already holds files: {held}.\n"
            f"  Name another directory, or add --force to replace this one once the export "
            f"passes its checks."
        )


@contextlib.contextmanager
def staged(out: Path):
    """A fresh staging directory beside ``out``, removed unless :func:`publish` took it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = _beside(out, "partial")
    staging.mkdir()
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, out: Path) -> None:
    """Put ``staging`` in place of ``out``; an old ``out`` steps aside first and goes after."""
    if not out.exists():
        os.replace(staging, out)
        return
    old = _beside(out, "replaced")
    os.replace(out, old)
    os.replace(staging, out)
    shutil.rmtree(old, ignore_errors=True)


def _beside(out: Path, what: str) -> Path:
    """A hidden name in ``out``'s directory, unique to this call."""
    return out.parent / f".{out.name}.{what}-{uuid.uuid4().hex[:8]}"
