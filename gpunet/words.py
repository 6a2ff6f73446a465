"""Small words every report shares: counts said as people say them."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 node', '2 nodes', '0 findings'; `many` where adding an s is wrong ('1 switch',
    '3 switches')."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
