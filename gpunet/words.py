"""Small words every report shares: counts said as people say them, and text fit to print."""

from __future__ import annotations

import re

# Control characters (C0 but tab, DEL, C1: ANSI escapes among them) in what the data or a
# server names (instances, devices, notes, an error's text) would drive the reader's
# terminal: shown escaped instead.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` as it may be printed on a terminal or in a log: control characters escaped
    (ESC as \\x1b, a newline as \\x0a: one line stays one line)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 node', '2 nodes', '0 findings'; `many` where adding an s is wrong ('1 switch',
    '3 switches')."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
