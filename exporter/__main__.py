"""The gpunet-exporter command, also `python -m exporter`.

The settings are read before the server is imported, so that an exporter serving plain
HTTP never loads OpenSSL: asyncio and aiohttp import the ssl module whenever they can, and
that maps libssl and libcrypto, 7 MB of a 43 MB process, for TLS it does not use; aiohttp
imports hashlib too, whose OpenSSL digests map libcrypto (3.4 MB) for hashes it never
takes. With a --web.config.file (by flag, GPUNET_WEB_CONFIG_FILE or --config) both are
imported as usual; TLS and passwords cannot be switched on by a reload without one, so
nothing later needs them."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from exporter.settings import parse_args


def note_sighup_while_starting(args: argparse.Namespace) -> None:
    """Until the server installs its own handlers (exporter/cli.py, before it reads the web
    config and binds the port), a SIGHUP would kill the exporter by default, and systemd counts
    that a clean exit. It comes before the config is read, so there is nothing to reload: it
    is noted, and the server logs it."""
    args.sighup_while_starting = False

    def noted(signum: int, frame: object) -> None:
        args.sighup_while_starting = True

    signal.signal(signal.SIGHUP, noted)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "serve":
        note_sighup_while_starting(args)  # before the imports below, which take a while
    if args.web_config_file is None:
        # A None entry makes `import ssl` raise ImportError, which the standard library and
        # aiohttp take as a Python built without OpenSSL. setdefault: never undo an import.
        sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
        # hashlib then takes CPython's own digests, as on a Python built without OpenSSL.
        sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]
    # aiohttp's signal lists (frozenlist) in Python rather than its C++ extension, which maps
    # the C++ runtime (0.9 MB) for lists read a few times a request.
    os.environ.setdefault("FROZENLIST_NO_EXTENSIONS", "1")
    from exporter.cli import run  # after the decision above: the server's imports follow it

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
