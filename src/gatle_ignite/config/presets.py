"""Whether a config set a field that ``base_config()`` presets, or left it at its preset.

``score_mode = "min"`` turns ``score_factor``'s preset 1 into -1, yet must refuse a factor the
config set to 1 itself: the two fields then say opposite things. After ``base_config()`` a
preset 1 and an assigned 1 are the same value, so while the loader runs ``get_config()``,
``base_config()`` presets these fields as references that note an assignment. The loader then
puts plain values back and keeps, on the config, the names left at their preset; an override
of one takes it out.
"""

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Optional

from ml_collections import config_dict

__all__ = ["WATCHED", "left_at_preset", "note_set", "preset", "presets_watched", "settle"]

# The preset fields whose being set, not only their value, the config checks read.
WATCHED = ("score_factor", "tester_score_factor")
# Where the loader keeps, on the config, the names of WATCHED left at their preset.
_LEFT = "_gatle_left_at_preset"
_watching = contextvars.ContextVar("gatle_watching_presets", default=False)


class _Noting(config_dict.FieldReference):
    """A preset value that notes whether anything assigned it."""

    def __init__(self, value) -> None:
        super().__init__(value, field_type=type(value))
        self.assigned = False

    def set(self, value, type_safe: bool = True) -> None:
        super().set(value, type_safe)
        self.assigned = True


def preset(value):
    """``value`` for a WATCHED field of ``base_config()``; while the loader watches, a
    reference to it that notes an assignment."""
    return _Noting(value) if _watching.get() else value


@contextlib.contextmanager
def presets_watched() -> Iterator[None]:
    """``base_config()`` calls inside preset the WATCHED fields as noting references."""
    token = _watching.set(True)
    try:
        yield
    finally:
        _watching.reset(token)


def settle(cfg) -> None:
    """Put plain values back for the WATCHED fields of ``cfg`` (what ``get_config()``
    returned) and keep on it those the config left at their preset."""
    if not isinstance(cfg, config_dict.ConfigDict):
        return
    fields = dict(cfg.items(preserve_field_references=True))
    references = {name: fields[name] for name in WATCHED if name in fields}
    if not all(isinstance(ref, _Noting) for ref in references.values()):
        return  # built otherwise: which were set cannot be told
    try:
        # ml_collections lists fields in sorted order: taking one out and back moves nothing.
        with cfg.unlocked():
            for name, reference in references.items():
                del cfg[name]
                cfg[name] = reference.get()
    except (AttributeError, KeyError, TypeError, ValueError):
        return  # a config that refuses changes (frozen) keeps its references
    left = {name for name, reference in references.items() if not reference.assigned}
    object.__setattr__(cfg, _LEFT, left)


def note_set(cfg, name: str) -> None:
    """An override set ``name``: it is no longer at its preset."""
    left = getattr(cfg, _LEFT, None)
    if isinstance(left, set):
        left.discard(name)


def left_at_preset(cfg, field: str) -> Optional[bool]:
    """Whether the config left ``field`` at its default: True or False, None when it cannot be
    told (a config the loader did not load). A field ``base_config()`` does not preset is left
    at its default when the config has no such field."""
    if field not in WATCHED:
        return field not in cfg
    left = getattr(cfg, _LEFT, None)
    return None if not isinstance(left, set) else field in left
