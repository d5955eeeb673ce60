"""What ``gatle-ignite config`` prints of a config: the fields it sets apart from the
framework's defaults, or every field; redacted either way."""

from collections.abc import Mapping

from ml_collections import config_dict

from gatle_ignite.callbacks.run_record import config_payload
from gatle_ignite.config.base import base_config

__all__ = ["config_text"]

_ABSENT = object()


def config_text(cfg, every_field: bool = False) -> str:
    """The config as ``print(cfg)`` shows it, cut to the fields that differ from the defaults
    unless ``every_field``."""
    payload = config_payload(cfg)
    if every_field:
        return str(config_dict.ConfigDict(payload))
    changed = _differing(payload, config_payload(base_config()))
    if not changed:
        return "every field holds its default (--all prints them)."
    shown = str(config_dict.ConfigDict(changed)).rstrip("\n")
    return f"fields that differ from the defaults (--all prints every field):\n{shown}\n"


def _differing(payload: Mapping, defaults) -> dict:
    """The part of ``payload`` that ``defaults`` does not hold, nested as in the payload."""
    differing = {}
    for key, value in payload.items():
        default = defaults.get(key, _ABSENT) if isinstance(defaults, Mapping) else _ABSENT
        if isinstance(value, Mapping) and value and isinstance(default, Mapping):
            inner = _differing(value, default)
            if inner:
                differing[key] = inner
        elif value != default:
            differing[key] = value
    return differing
