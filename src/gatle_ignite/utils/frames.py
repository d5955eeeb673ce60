"""Where in a traceback an error comes from: the task's own code, or a library it called.

A failure surfaces inside torch, ignite or gatle-ignite, which only carry it; the line worth
showing is the innermost one of the task's own code. When the error was raised inside another
installed library (``timm``, ``transformers``), that library's line is shown too, named as such.
"""

import re
import site
import sysconfig
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import ignite
import torch

import gatle_ignite

__all__ = ["add_note", "library_frame", "library_note", "where_raised"]

# Frames inside these say where a failure surfaced, not which code caused it.
_CARRIERS = tuple(str(Path(module.__file__).parent) for module in (torch, ignite, gatle_ignite))


def _installed_dirs() -> tuple:
    """Where installed packages live (site-packages), longest first."""
    paths = sysconfig.get_paths()
    found = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        found.add(site.getusersitepackages())
    return tuple(sorted((str(Path(p)) for p in found), key=len, reverse=True))


def _stdlib_dirs() -> tuple:
    paths = sysconfig.get_paths()
    return tuple({str(Path(paths["stdlib"])), str(Path(paths["platstdlib"]))})


def _frames(error: BaseException) -> list:
    """The frames of ``error`` and of the error it wraps, outermost first."""
    frames, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        frames += traceback.extract_tb(error.__traceback__)
        error = error.__cause__
    return frames


def _package(filename: str) -> Optional[str]:
    """The installed package ``filename`` belongs to; None for the task's own code."""
    for root in _installed_dirs():
        if filename.startswith(root + "/"):
            return Path(filename[len(root) + 1 :]).parts[0]
    return None


def _own(filename: str) -> bool:
    return not filename.startswith(_CARRIERS + _stdlib_dirs()) and _package(filename) is None


def library_frame(error: BaseException) -> Optional[tuple]:
    """``(package, path inside it, frame)`` when ``error`` was raised inside an installed
    library other than torch, ignite and gatle-ignite; else None."""
    frames = [f for f in _frames(error) if not f.filename.startswith(_CARRIERS)]
    if not frames:
        return None
    innermost = frames[-1]
    package = _package(innermost.filename)
    if package is None:
        return None
    inside = innermost.filename[innermost.filename.index(f"/{package}/") + 1 :]
    return package, inside, innermost


def where_raised(error: BaseException, library_line: bool = True) -> str:
    """``\\n  at FILE:LINE, in NAME`` for the innermost line of the task's own code, after the
    library's own line when the error was raised inside a library (and ``library_line``);
    empty when neither."""
    lines = []
    library = library_frame(error) if library_line else None
    if library is not None:
        package, inside, frame = library
        lines.append(f"\n  raised inside {package}: {inside}:{frame.lineno}, in {frame.name}")
    own = [frame for frame in _frames(error) if _own(frame.filename)]
    if own:
        frame = own[-1]
        lines.append(f"\n  at {frame.filename}:{frame.lineno}, in {frame.name}")
    return "".join(lines)


def _leaves(params, prefix: str = "") -> dict:
    """``{"a.b": value}`` for the scalar leaves of nested params."""
    leaves = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or hasattr(value, "items"):
            leaves.update(_leaves(value, f"{name}."))
        else:
            leaves[name] = value
    return leaves


def _related(name: str, words: set) -> bool:
    """Whether a word of the field's name and one of the message share a stem (four letters:
    ``in_chans`` and "channels")."""
    parts = [part for part in re.split(r"[_.]", name.lower()) if len(part) >= 4]
    return any(word[:4] == part[:4] for part in parts for word in words)


def _suspects(message: str, params) -> list:
    """The fields of ``params`` the message most likely speaks of: its value is in the message
    and a word of its name too, else one of the two. Booleans are too common to tell."""
    numbers = set(re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])", message))
    words = {word for word in re.findall(r"[a-z]+", message.lower()) if len(word) >= 4}
    scored = {}
    for name, value in _leaves(params).items():
        if isinstance(value, str):
            in_message = len(value) >= 3 and value in message
        else:
            in_message = isinstance(value, (int, float)) and str(value) in numbers
        scored[name] = 2 * in_message + _related(name, words)
    best = max(scored.values(), default=0)
    return [name for name, score in scored.items() if score == best and best > 0]


def library_note(
    error: BaseException, field: str, params, built: str, defaults=None
) -> Optional[str]:
    """A note for ``error`` when it was raised inside a library: the config field whose params
    built the object that raised it (``built`` leads to it: "while building X from"), and the
    likeliest of its fields, else of the object's own ``defaults`` the params leave as they
    are (a ``transformers`` model's config); None when no library raised it."""
    from gatle_ignite.redaction import shown_value

    library = library_frame(error)
    if library is None:
        return None
    package, inside, frame = library
    params = dict(params or {})
    shown = ", ".join(f"{k}={shown_value(f'{field}.{k}', v)}" for k, v in params.items())
    note = (
        f"{type(error).__name__} raised inside {package} ({inside}:{frame.lineno}, in "
        f"{frame.name}), {built} {field} = {{{shown}}}."
    )
    likely = _suspects(str(error), params)
    if likely:
        fields = ", ".join(f"{field}.{name}" for name in likely)
        its = "its" if len(likely) == 1 else "their"
        return note + f"\n  The message speaks of {fields}: check {its} value."
    unset = {k: v for k, v in (defaults or {}).items() if k not in params}
    likely = _suspects(str(error), unset)
    if likely:
        held = ", ".join(f"{name} = {unset[name]!r}" for name in likely)
        note += (
            f"\n  The message speaks of {held}, which {field} leaves at the model's own "
            f"default: set {field}.{likely[0]} for your data."
        )
    return note


def add_note(error: BaseException, note: str) -> None:
    """Add ``note`` to the traceback Python prints for ``error`` (Python 3.11 and later)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
