"""The Prometheus exposition format's series keys, as traces and NCCL dumps write them."""

from __future__ import annotations

import re

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
# The plain shape every writer of gpunet traces uses (no spaces, no escapes): read at once.
_PLAIN = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)",?')
_ALL_PLAIN = re.compile(r'(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",?)*')


def parse_series(key: str) -> tuple[str, dict[str, str]]:
    """'name{a="b",c="d"}' -> ('name', {'a': 'b', 'c': 'd'})."""
    name, brace, rest = key.partition("{")
    if not brace:
        return name, {}
    if not rest.endswith("}"):
        after = rest.rfind("} ")
        if after >= 0:  # a line of more fields than its format has: the key ran on past its labels
            raise ValueError(f"text after the label set: {rest[after + 2:][:30]!r} (a field too many?)")
        raise ValueError("unterminated label set")
    body = rest[:-1]
    if _ALL_PLAIN.fullmatch(body):
        return name, dict(_PLAIN.findall(body))
    labels, pos = {}, 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if not m or m.end() == pos:
            raise ValueError(f"malformed labels near {body[pos:pos + 30]!r}")
        value = m.group(2)
        if "\\" in value:
            value = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], value)
        labels[m.group(1)] = value
        pos = m.end()
    return name, labels
