"""The search space: each parameter is a dotted config key and the values a trial may give it.

Written the same way on the command line (``--param KEY=SPACE``) and in a sweep file:
``[64, 128, 256]`` (a categorical, or an axis of a grid), ``loguniform(1e-4, 1e-2)``,
``uniform(0.0, 0.5)`` or ``int(1, 8)`` (both bounds included). Parsing only reads literals; it
never runs what it is given.
"""

import ast
import math
from dataclasses import dataclass
from typing import Union

from gatle_ignite.dispatch import ConfigError

__all__ = ["Param", "parse_param", "parse_space"]

_RANGES = ("uniform", "loguniform", "int")
_FORMS = "a list [a, b, ...], loguniform(low, high), uniform(low, high) or int(low, high)"
Number = Union[int, float]


@dataclass(frozen=True)
class Param:
    """One parameter: ``kind`` is ``choice`` (``choices``) or a range (``low`` .. ``high``)."""

    key: str
    kind: str
    choices: tuple = ()
    low: Number = 0
    high: Number = 0

    def suggest(self, trial):
        """The value an Optuna trial gives this parameter (the stored one, once drawn)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, self.low, self.high)
        return trial.suggest_float(self.key, self.low, self.high, log=self.kind == "loguniform")

    def probes(self) -> tuple:
        """The values to try on the config before the first trial: every choice, or both ends."""
        return self.choices if self.kind == "choice" else (self.low, self.high)

    def admits(self, value) -> bool:
        """Whether ``value`` lies in this space (a value asked for by hand, e.g. enqueued)."""
        if self.kind == "choice":
            return any(value == c and type(value) is type(c) for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        return self.low <= value <= self.high

    def text(self) -> str:
        """The space as it is written, in one canonical spelling."""
        if self.kind == "choice":
            return repr(list(self.choices))
        return f"{self.kind}({self.low!r}, {self.high!r})"


def parse_param(item: str) -> Param:
    """``KEY=SPACE`` from the command line."""
    if "=" not in item:
        raise ConfigError(
            f"--param {item!r} is not of the form KEY=SPACE\n"
            f"  For example --param 'optimizer_params.lr=loguniform(1e-4, 1e-2)'."
        )
    key, space = item.split("=", 1)
    return parse_space(key.strip(), space)


def parse_space(key: str, space) -> Param:
    """The space for ``key``: its text, or (in a sweep file) a list of choices."""
    if not key or not all(key.split(".")):
        raise ConfigError(f"--param {key!r}: the key must be a dotted config key")
    if isinstance(space, (list, tuple)):
        return _choice(key, tuple(space))
    if not isinstance(space, str):
        raise ConfigError(f"param {key!r}: the space must be {_FORMS}; got {space!r}")
    try:
        node = ast.parse(space.strip(), mode="eval").body
    except SyntaxError:
        raise _not_a_space(key, space) from None
    if isinstance(node, (ast.List, ast.Tuple)):
        return _choice(key, tuple(_literal(key, space, node)))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _range(key, space, node)
    raise _not_a_space(key, space)


def _not_a_space(key: str, space) -> ConfigError:
    return ConfigError(f"param {key!r}: {space!r} is not a search space\n  Write {_FORMS}.")


def _literal(key: str, space: str, node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise _not_a_space(key, space) from None


def _choice(key: str, choices: tuple) -> Param:
    if not choices:
        raise ConfigError(f"param {key!r}: a list of choices needs at least one value")
    for value in choices:
        # What Optuna stores for a categorical; a list or a dict would not survive the storage.
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise ConfigError(
                f"param {key!r}: the choice {value!r} is a {type(value).__name__}; choices must "
                f"be numbers, strings, booleans or None.\n"
                f"  Sweep over a name for it instead (a string the config maps to the value)."
            )
    repeated = sorted({repr(v) for v in choices if sum(_same(v, c) for c in choices) > 1})
    if repeated:
        raise ConfigError(f"param {key!r}: the choices repeat {', '.join(repeated)}")
    return Param(key, "choice", choices=choices)


def _same(a, b) -> bool:
    return a == b and type(a) is type(b)


def _range(key: str, space: str, node: ast.Call) -> Param:
    kind = node.func.id
    if kind not in _RANGES or node.keywords or len(node.args) != 2:
        raise _not_a_space(key, space)
    low, high = (_literal(key, space, arg) for arg in node.args)
    for bound in (low, high):
        if isinstance(bound, bool) or not isinstance(bound, (int, float)):
            raise ConfigError(f"param {key!r}: the bounds of {space!r} must be numbers")
        if not math.isfinite(bound):
            raise ConfigError(f"param {key!r}: the bounds of {space!r} must be finite")
    if kind == "int" and not (isinstance(low, int) and isinstance(high, int)):
        raise ConfigError(f"param {key!r}: int(low, high) takes whole numbers, got {space!r}")
    if not low < high:
        raise ConfigError(f"param {key!r}: {space!r} needs low < high")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"param {key!r}: {space!r} needs low > 0 (it is a log scale)")
    if kind != "int":
        low, high = float(low), float(high)
    return Param(key, kind, low=low, high=high)
