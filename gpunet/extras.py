"""What an optional part of gpunet needs beyond the base install, said in one line.

The base install (`pip install .`) is the exporter's: its image and nodes carry no data
stack. `diagnose` and `gpunet-simulate` need the "diagnoser" extra; without it they would
die in a traceback on their first import of numpy, which names neither the cause nor the fix.
"""

from __future__ import annotations

import importlib

DIAGNOSER_EXTRA = ("numpy", "pandas", "scipy")


def require(extra: str, modules: tuple[str, ...], part: str) -> None:
    """Exit with one line naming the missing module and the extra that brings it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise SystemExit(f"{part}: the Python package {e.name or name!r} is missing: it comes with the "
                             f"{extra!r} extra: pip install 'gpunet[{extra}]' (or, from a clone, "
                             f"pip install '.[{extra}]')") from None
