"""Connection hygiene for the HTTP server, what a well-run Go exporter gets from
http.Server's ReadHeaderTimeout, IdleTimeout and WriteTimeout and netutil.LimitListener:

- a cap on open connections: one past it is closed as it is accepted;
- a header timeout: a request must arrive whole within `header_timeout` of its first byte;
- an idle timeout: a connection with no request under way is closed after `idle_timeout`
  (aiohttp's keep-alive timeout, which also covers a connection that never sends);
- a write timeout: a response not taken by the client within `write_timeout` is cut
  (exporter/server.py writes bodies in chunks, so a client that never reads holds one
  chunk in memory, not the body);
- TLS handshakes must finish within `header_timeout`.

Every connection and request turned away is counted in gpunet_exporter_http_refused_total.

The listening socket is opened once; each `Listener.serve` serves a duplicate of it with a
TLS context, so a reload swaps in a freshly built context without a moment of not
listening, and `close_connections` then drops the connections made under the old one.
"""

from __future__ import annotations

import asyncio
import resource
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from exporter.registry import Registry

if TYPE_CHECKING:  # a context comes from exporter/webconfig.py, which imports ssl only for TLS
    import ssl


def default_max_connections() -> int:
    """256, or half the file limit where that is lower: the collectors' reads need the rest
    (with LimitNOFILE=100, 150 connections starved them with "Too many open files")."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 256 if soft == resource.RLIM_INFINITY else max(8, min(256, soft // 2))


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256
    header_timeout: float = 10.0
    idle_timeout: float = 60.0  # above Prometheus' usual 15 s and 30 s scrape intervals: keep-alive holds
    write_timeout: float = 30.0


class Connections:
    """The open connections: counted, capped, and watched while a request's header arrives."""

    def __init__(self, limits: Limits, registry: Registry):
        self.limits = limits
        self.registry = registry
        self._open: dict[asyncio.BaseTransport, _Watched] = {}

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Watched(self, inner())

    def __len__(self) -> int:
        return len(self._open)

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        watched = self._open.get(transport) if transport is not None else None
        if watched is not None:
            watched.request_started()

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        watched = self._open.get(transport) if transport is not None else None
        if watched is not None:
            watched.in_request = False

    def close_connections(self) -> None:
        """Close every connection once its request in progress is answered (after a reload)."""
        for watched in list(self._open.values()):
            watched.close_when_done()

    def _opened(self, watched: _Watched, transport: asyncio.BaseTransport) -> bool:
        if len(self._open) >= self.limits.max_connections:
            self.registry.count_refused("connection_limit")
            return False
        self._open[transport] = watched
        self.registry.set_open_connections(len(self._open))
        return True

    def _closed(self, transport: asyncio.BaseTransport) -> None:
        self._open.pop(transport, None)
        self.registry.set_open_connections(len(self._open))


class _Watched(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the cap and the header timer."""

    def __init__(self, owner: Connections, inner: asyncio.Protocol):
        self.owner = owner
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self.in_request = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.owner._opened(self, transport):
            transport.abort()  # type: ignore[attr-defined]
            return
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        if self._timer is None and not self.in_request:
            # The first byte of a request starts its clock; the server's middleware stops it.
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.owner.limits.header_timeout, self._header_timeout)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.transport is not None else None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.owner._closed(self.transport)
            self.inner.connection_lost(exc)

    def request_started(self) -> None:
        self._cancel_timer()
        self.in_request = True

    def close_when_done(self) -> None:
        close = getattr(self.inner, "close", None)  # aiohttp's RequestHandler: after the request in progress
        if close is not None:
            close()
        elif self.transport is not None:
            self.transport.close()

    def _header_timeout(self) -> None:
        self._timer = None
        self.owner.registry.count_refused("header_timeout")
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Listener:
    """One listening socket, served under successive TLS contexts."""

    def __init__(self, host: str, port: int, runner: web.AppRunner, connections: Connections):
        # asyncio accepts up to `backlog` connections in one go, each a file before the cap can
        # close it: a quarter of the cap keeps a flood within the file limit's other half.
        self.backlog = max(8, min(128, connections.limits.max_connections // 4))
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=self.backlog)
        self.runner = runner
        self.connections = connections
        self._server: asyncio.Server | None = None

    async def serve(self, ssl_context: ssl.SSLContext | None) -> None:
        """Serve with this TLS context (None: plain HTTP) from now on; the previous server
        stops accepting once the new one is listening."""
        previous = self._server
        assert self.runner.server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.connections.factory(self.runner.server), sock=self.socket.dup(), ssl=ssl_context,
            backlog=self.backlog, ssl_handshake_timeout=self.connections.limits.header_timeout if ssl_context else None)
        if previous is not None:
            previous.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.socket.close()
