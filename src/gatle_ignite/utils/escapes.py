"""Text from a file someone else wrote, made safe to print on a terminal.

A run's name, its stop reason or a directory's name come from files anyone may have written. A
terminal acts on the control characters in them (an escape sequence clears the screen or
recolours what follows, a carriage return or newline starts a line that looks like the
command's own), so the commands that print them show those characters escaped instead.
"""

import unicodedata

__all__ = ["escaped"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Control characters, and the ones that start a line or reorder the text around them.
_CATEGORIES = {"Cc", "Zl", "Zp"}
_BIDI = {
    "\u061c",
    "\u200e",
    "\u200f",
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(char: str) -> bool:
    return char in _BIDI or unicodedata.category(char) in _CATEGORIES


def escaped(text, lines: bool = False) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``, ``\\n``,
    ``\\u202e``); ``lines`` keeps newlines and tabs, for a message of several lines."""
    text = str(text)
    if text.isprintable():
        return text
    kept = "\n\t" if lines else ""
    return "".join(_escape(c) if c not in kept and _unsafe(c) else c for c in text)
