"""Pieces of PromQL that both the diagnoser's queries and the queries it prints need."""

from __future__ import annotations

import re


def regex_literal(value: str) -> str:
    """A label value as a literal inside a PromQL regex inside a PromQL double-quoted string:
    RE2's special characters escaped, that escape's backslash escaped for the string
    (`dgx001\\.cluster`), then the string's own quote and newline. (Python's re.escape also
    escapes spaces and other characters, which RE2 refuses.)"""
    pattern = re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", value)  # RE2's escape: one backslash
    return pattern.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
