"""What a run records about its own config: redacted, JSON-able, and written to ``config.json``."""

import json
import os

__all__ = [
    "CONFIG_FILE",
    "REDACTED",
    "SECRET_SUFFIXES",
    "config_payload",
    "flat_params",
    "write_config_json",
]

# A field named like a credential is replaced before the config reaches any sink or file.
SECRET_SUFFIXES = ("_url", "_key", "_token", "_secret")
REDACTED = "<redacted>"
CONFIG_FILE = "config.json"


def _is_secret(name) -> bool:
    return isinstance(name, str) and name.lower().endswith(SECRET_SUFFIXES)


def _redact(value):
    if isinstance(value, dict):
        return {
            key: REDACTED if _is_secret(key) and inner not in (None, "") else _redact(inner)
            for key, inner in value.items()
        }
    if isinstance(value, list):
        return [_redact(item) for item in value]
    return value


def config_payload(cfg) -> dict:
    """The whole config as plain JSON types, with every secret-named field redacted."""
    if hasattr(cfg, "to_json_best_effort"):
        plain = json.loads(cfg.to_json_best_effort())
    else:
        plain = json.loads(json.dumps(dict(cfg), default=str))
    return _redact(plain)


def flat_params(payload: dict, prefix: str = "") -> dict:
    """``{"a.b": "<value>"}`` strings for every leaf of a payload, for param-style sinks."""
    flat = {}
    for key, value in payload.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_params(value, prefix=f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value)
    return flat


def write_config_json(cfg) -> str:
    """Write the redacted config to ``<save_dir>/config.json``; returns the path."""
    os.makedirs(cfg.save_dir, exist_ok=True)
    path = os.path.join(cfg.save_dir, CONFIG_FILE)
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(config_payload(cfg), handle, indent=2)
        handle.write("\n")
    # A crash mid-write must not leave a truncated config.json behind.
    os.replace(partial, path)
    return path
