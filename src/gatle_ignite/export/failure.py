"""What an exporter says when it fails, in one config error; and its chatter kept off the screen.

torch's exporters print progress lines, warnings and, on failure, the whole partial graph.
The command prints its own lines instead, and a failure names the stage, the exporter's reason
and the line of the task's code it came from.
"""

import contextlib
import io
import logging
import re

from gatle_ignite.dispatch import ConfigError
from gatle_ignite.utils.frames import where_raised

__all__ = ["exporter_reason", "failed_at", "quiet_exporter"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DATA_DEPENDENT = ("data-dependent", "DataDependent")


@contextlib.contextmanager
def quiet_exporter():
    """Hold back what the exporter prints, logs and warns while it runs."""
    held = io.StringIO()
    disabled = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
            yield held
    finally:
        logging.disable(disabled)


def _innermost(error: BaseException) -> BaseException:
    """The error the exporter wrapped (torch.onnx wraps torch.export's own)."""
    seen = {id(error)}
    while error.__cause__ is not None and id(error.__cause__) not in seen:
        error = error.__cause__
        seen.add(id(error))
    return error


def exporter_reason(error: BaseException) -> str:
    """``Type: first line of the message``, from the innermost error."""
    inner = _innermost(error)
    lines = [line.strip() for line in _ANSI.sub("", str(inner)).splitlines() if line.strip()]
    first = lines[0] if lines else "(no message)"
    return f"{type(inner).__name__}: {first}"


def _advice(error: BaseException) -> str:
    inner = _innermost(error)
    if any(mark in f"{type(inner).__name__} {inner}" for mark in _DATA_DEPENDENT):
        return (
            "  The forward branches on a tensor's values (data-dependent control flow), here or "
            "inside a module it calls; an exported graph cannot. Rewrite the branch with "
            "torch.cond or torch.where, or export a model without it."
        )
    return (
        "  The exporter could not capture or translate the model's forward; the reason above "
        "is its own."
    )


def failed_at(stage: str, error: BaseException) -> ConfigError:
    """The config error for an exporter's failure at ``stage``."""
    return ConfigError(
        f"export failed at {stage}: {exporter_reason(error)}{where_raised(error)}\n{_advice(error)}"
    )
