"""How the CLI shows warnings: gatle-ignite's own as one ``warning:`` line with its advice.

Python prints a warning with the file, line number and source line that raised it. For the
framework's warnings those are its internals, which read like a crash to a user; the message
already says what happened and what to do. Other packages' warnings keep Python's format.
"""

import warnings
from pathlib import Path

from gatle_ignite.utils.escapes import escaped

__all__ = ["show_framework_warnings_plainly"]

_PACKAGE = str(Path(__file__).resolve().parents[1])
_python_format = warnings.formatwarning


def _format(message, category, filename, lineno, line=None) -> str:
    from gatle_ignite.redaction import redact_text  # ml_collections: not for `--version`

    # A warning may quote an exception's text, and with it a URL's credentials; or a path from
    # a directory someone else wrote, with control characters in its names.
    if str(filename).startswith(_PACKAGE):
        return redact_text(f"warning: {escaped(message, lines=True)}\n")
    return redact_text(_python_format(message, category, filename, lineno, line))


def show_framework_warnings_plainly() -> None:
    """Install the format for this process (the CLI's and each rank it spawns)."""
    warnings.formatwarning = _format
