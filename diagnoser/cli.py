"""diagnose: names the bottleneck of a slowed training job (issue 5; not built yet)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("diagnose: not implemented yet (tracked in issue 5)", file=sys.stderr)
    return 2
