"""What a run records about its own config: redacted, JSON-able, and written to ``config.json``.

What is secret is decided in :mod:`gatle_ignite.redaction`; its names are re-exported here, where
0.4-era code imports them.
"""

import json
import os

from ml_collections import config_dict

from gatle_ignite.redaction import (
    REDACTED,
    SECRET_SUFFIXES,
    config_payload,
    is_secret_name,
    is_secret_path,
    redact_text,
    shown_value,
)
from gatle_ignite.run.identity import flatten
from gatle_ignite.run.layout import CONFIG_FILE
from gatle_ignite.run.manifest import write_atomically
from gatle_ignite.run.storage import local_dir

__all__ = [
    "CONFIG_FILE",
    "REDACTED",
    "SECRET_SUFFIXES",
    "config_payload",
    "flat_params",
    "is_secret_name",
    "is_secret_path",
    "redact_text",
    "redacted_config_text",
    "shown_value",
    "write_config_json",
]


def redacted_config_text(cfg) -> str:
    """The config as ``print(cfg)`` shows it, from the redacted payload."""
    return str(config_dict.ConfigDict(config_payload(cfg)))


def flat_params(payload: dict, prefix: str = "") -> dict:
    """``{"a.b": "<value>"}`` strings for every leaf of a payload, for param-style sinks."""
    return {
        name: value if isinstance(value, str) else json.dumps(value)
        for name, value in flatten(payload, prefix).items()
    }


def write_config_json(cfg) -> str:
    """Write the redacted config to ``<save_dir>/config.json``; returns the path."""
    directory = local_dir(cfg.save_dir)
    os.makedirs(directory, exist_ok=True)
    path = directory / CONFIG_FILE
    write_atomically(path, json.dumps(config_payload(cfg), indent=2) + "\n")
    return str(path)
