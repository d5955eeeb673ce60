"""Which config names the framework reads, and which of them an unknown name resembles.

A config may add fields of its own, so an unknown name is refused only when it is so close to a
framework field that it is almost certainly a misspelling of it: the framework would never read
it, and the run would silently use the default of the field meant.
"""

import dataclasses
import difflib
import re
from collections.abc import Iterable
from typing import Optional

from gatle_ignite.config.base import known_fields
from gatle_ignite.specs import EngineSpec

__all__ = [
    "HINT_CUTOFF",
    "TYPO_CUTOFF",
    "closest",
    "framework_fields",
    "is_engine_field",
    "misspelt_fields",
]

# A misspelling refuses the run, so only near-identical names count: 'max_epoch' (0.95 to
# 'max_epochs') and 'optimiser_params' (0.94) do; 'seeds' (0.89 to 'seed') and 'speed' do not.
TYPO_CUTOFF = 0.9
# A "did you mean" hint on a key that is refused anyway may reach further.
HINT_CUTOFF = 0.7

# Read by the discord backend, yet declared nowhere.
_UNDECLARED = ("discord_username",)

_ANY_NAME = "NAME"


def _spec_fields(spec: EngineSpec) -> set[str]:
    """The config fields ``spec`` reads: its ``*_field`` attributes and its split's data."""
    named = {
        getattr(spec, f.name)
        for f in dataclasses.fields(spec)
        if f.name.endswith("_field") and getattr(spec, f.name)
    }
    if spec.score_mode_field:
        named.add(spec.score_mode_field)
    return named | {f"{spec.split}_ds_name", f"{spec.split}_ds_params"}


def _engine_field_patterns() -> tuple[re.Pattern, ...]:
    # Derived from for_split itself, so a field the convention gains is recognised too.
    fields = _spec_fields(EngineSpec.for_split(_ANY_NAME))
    return tuple(re.compile(re.escape(f).replace(_ANY_NAME, r"\w+")) for f in sorted(fields))


_ENGINE_FIELDS = _engine_field_patterns()


def is_engine_field(name: str) -> bool:
    """Whether ``name`` follows the ``EngineSpec.for_split(<any name>)`` field convention."""
    return any(pattern.fullmatch(name) for pattern in _ENGINE_FIELDS)


def framework_fields(specs: Iterable[EngineSpec] = ()) -> set[str]:
    """Every top-level field the framework reads, with those of the declared engines."""
    names = set(known_fields()) | set(_UNDECLARED)
    for spec in specs:
        names |= _spec_fields(spec)
    return names


def closest(name: str, candidates: Iterable[str], cutoff: float) -> Optional[str]:
    """The candidate most similar to ``name`` at ``cutoff`` or above, else None."""
    matches = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=cutoff)
    return matches[0] if matches else None


def misspelt_fields(cfg, specs: Iterable[EngineSpec] = ()) -> list[tuple[str, str]]:
    """``(name, framework field it resembles)`` for each field of ``cfg`` that looks misspelt."""
    known = framework_fields(specs)
    found = []
    for name in cfg.keys():
        if not isinstance(name, str) or name in known or is_engine_field(name):
            continue
        match = closest(name, known, TYPO_CUTOFF)
        if match is not None:
            found.append((name, match))
    return found
