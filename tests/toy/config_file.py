"""The toy task's config as a file, for the command line to load."""

from pathlib import Path


def write_toy_config(path, **fields) -> str:
    """Write a config file whose get_config() is ``toy_config(**fields)``; returns its path."""
    Path(path).write_text(
        "from tests.toy.config import toy_config\n\n\n"
        f"def get_config():\n    return toy_config(**{fields!r})\n"
    )
    return str(path)
