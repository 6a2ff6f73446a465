"""Connection hygiene for the HTTP server, what a well-run Go exporter gets from
http.Server's ReadHeaderTimeout, IdleTimeout and WriteTimeout, and more under a flood:

- a header timeout: a request must arrive whole within `header_timeout` of the connection
  opening (or, on a kept-alive connection, of its first byte), so a connection that never
  sends, or sends half a request, is closed then, not held for the idle timeout;
- an idle timeout: a kept-alive connection with no request under way is closed after
  `idle_timeout` (aiohttp's keep-alive timeout), and so is a fresh one where that comes
  before the header timeout;
- a cap on open connections. A connection accepted at the cap takes the place of one that
  is waiting on its client: of those that had their chance (`HAD_ITS_CHANCE`), the silent
  one that has waited longest, else the half-sent one, else one whose client does not take
  its answer, else the idle kept-alive one; else the one that has waited longest of those
  just there (a flood that reconnects as soon as it is closed: a scraper's fresh
  connection, the newest, goes last); else one whose request waits for a password check
  (guessers wait their turn). A connection serving a request is never shed: only when
  every one is, is the newcomer closed. So connections that send nothing, or half a
  request, cannot lock out a scraper that sends a whole one (before, the newcomer was
  closed: 0 of 30 scrapes beside 300 silent sockets). The kernel's accept queue is as long
  as the system allows, so a scraper's connection waits there rather than being dropped;
- a write timeout: a response not taken by the client within `write_timeout` is cut
  (exporter/server.py writes bodies in chunks, so a client that never reads holds one
  chunk in memory, not the body);
- TLS handshakes must finish within `header_timeout`.

Every connection and request turned away or cut is counted in
gpunet_exporter_http_refused_total (a connection shed at the cap as connection_limit).

The listening socket is opened once; each `Listener.serve` serves a duplicate of it with a
TLS context, so a reload swaps in a freshly built context without a moment of not
listening, and `close_connections` then ends the connections made under the old one: at
once where no request is under way (an idle kept-alive connection left open would answer
nothing), after its answer where one is.
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


# What a connection is doing; all but SERVING are waiting on the client, and can be shed.
SILENT = "silent"  # open, not a byte yet: the header clock runs from the connection's start
RECEIVING = "receiving"  # part of a request's header is in: the header clock runs
SERVING = "serving"  # a request is being answered, until its response is written
WAITING = "waiting"  # its request waits for a password check (its client's turn, or bcrypt)
STALLED = "stalled"  # serving, but the client does not take the response (the write timeout runs)
IDLE = "idle"  # answered, waiting for its next request (aiohttp's idle timeout runs)
CLOSED = "closed"  # closed, or shed and closing
# Seconds a connection may be silent, sending its header or idle before it counts as
# waiting: a client sends its request within a round trip of connecting (TLS: of its
# handshake), a client scraping back to back its next one within a round trip of an answer.
HAD_ITS_CHANCE = 1.0


class Connections:
    """The open connections: counted, capped, timed while a request's header arrives, and
    shed at the cap (see the module's doc string)."""

    def __init__(self, limits: Limits, registry: Registry):
        self.limits = limits
        self.registry = registry
        self._open: dict[asyncio.BaseTransport, _Watched] = {}
        # The waiting ones, per state, in the order they entered it (a dict keeps the order of
        # insertion; a move is a pop and an insert, O(1), as is finding the longest waiting).
        self._waiting: dict[str, dict[_Watched, None]] = {state: {} for state in (SILENT, RECEIVING, WAITING,
                                                                                  STALLED, IDLE)}

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Watched(self, inner)

    def __len__(self) -> int:
        return len(self._open)

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        """A whole request arrived (the server's middleware, in the task that answers it)."""
        watched = self._open.get(transport) if transport is not None else None
        if watched is None:
            return
        watched.request_started()
        task = asyncio.current_task()
        if task is not None:
            # aiohttp writes the response in this same task, after the middleware returned:
            # when the task ends the response is out and the connection waits for the next.
            task.add_done_callback(lambda _: watched.response_sent())

    def waiting(self, transport: asyncio.BaseTransport | None, waiting: bool) -> None:
        """Its request waits for a password check (exporter/server.py): meanwhile the
        connection holds no work of ours, and can be shed at the cap, after all the others
        that wait (password guessers wait their turn)."""
        watched = self._open.get(transport) if transport is not None else None
        if watched is not None:
            watched.waiting(waiting)

    def closing(self, transport: asyncio.BaseTransport | None) -> bool:
        """Whether this connection ends after its response in progress (a reload came)."""
        watched = self._open.get(transport) if transport is not None else None
        return watched is not None and watched.closing

    def close_connections(self) -> None:
        """After a reload: close the connections with no request under way at once, the
        others once their response is written."""
        for watched in list(self._open.values()):
            watched.close_when_done()

    def _admit(self, watched: _Watched, transport: asyncio.BaseTransport) -> bool:
        if len(self._open) >= self.limits.max_connections:
            shed = self._longest_waiting()
            self.registry.count_refused("connection_limit")  # the one shed, or the newcomer
            if shed is None:
                return False
            shed.abort()
        self._open[transport] = watched
        self._moved(watched, SERVING, SILENT)
        self.registry.set_open_connections(len(self._open))
        return True

    def _longest_waiting(self) -> _Watched | None:
        """The connection to shed for a newcomer at the cap; None when all are serving."""
        now = asyncio.get_running_loop().time()
        for state in (SILENT, RECEIVING, STALLED, IDLE):
            oldest = next(iter(self._waiting[state]), None)
            if oldest is not None and (state == STALLED or now - oldest.since >= HAD_ITS_CHANCE):
                return oldest
        just_there = [w for w in (next(iter(self._waiting[s]), None) for s in (SILENT, RECEIVING, IDLE)) if w]
        if just_there:
            return min(just_there, key=lambda w: w.since)
        # Last, requests waiting for a password check: shed before, guessers would reconnect
        # and guess again at once, as fast as a flood of silent connections sheds them.
        return next(iter(self._waiting[WAITING]), None)

    def _moved(self, watched: _Watched, before: str, after: str) -> None:
        if before in self._waiting:
            self._waiting[before].pop(watched, None)
        if after in self._waiting:
            self._waiting[after][watched] = None

    def _forget(self, watched: _Watched) -> None:
        """Gone, or going (aborted: its connection_lost comes a loop iteration later)."""
        if watched.transport is not None and self._open.get(watched.transport) is watched:
            del self._open[watched.transport]
            watched._enter(CLOSED)
            self.registry.set_open_connections(len(self._open))


class _Watched(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the cap and the header timer. aiohttp's
    is made at the first byte: a connection that never sends (a flood of them, shed at the
    cap thousands of times a second) costs no request handler, task or parser."""

    def __init__(self, owner: Connections, make_inner: Callable[[], asyncio.Protocol]):
        self.owner = owner
        self.make_inner = make_inner
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.state = SILENT
        self.since = 0.0  # loop time it entered its state
        self.closing = False  # close once the response in progress is written
        self.more_sent = False  # bytes of a next request came in while one was served
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.since = asyncio.get_running_loop().time()
        if not self.owner._admit(self, transport):
            transport.abort()  # type: ignore[attr-defined]
            return
        self.transport = transport
        limits = self.owner.limits
        if limits.idle_timeout < limits.header_timeout:
            # Idle until it sends: closed at the idle timeout, as aiohttp closes a kept-alive
            # connection (not counted as refused); its header clock starts with its first byte.
            self._timer = asyncio.get_running_loop().call_later(limits.idle_timeout, self._idle_timeout)
        else:
            self._start_timer()  # a fresh connection must send its request within the header timeout

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        if self.inner is None:
            self.inner = self.make_inner()
            self.inner.connection_made(self.transport)
        if self.state in (SERVING, WAITING, STALLED):
            self.more_sent = True  # pipelined: its header clock starts once this answer is out
        elif self.state != RECEIVING:
            if self.state == SILENT and self.owner.limits.idle_timeout < self.owner.limits.header_timeout:
                self._cancel_timer()  # the idle clock stops, the header clock starts
            self._enter(RECEIVING)
            self._start_timer()  # kept alive: the first byte starts the clock (silent: it runs)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.transport is None or self.inner is None:
            return None  # nothing asked: the transport closes
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        if self.state == SERVING:
            self._enter(STALLED)  # the client is not taking its response
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.state == STALLED:
            self._enter(SERVING)
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.owner._forget(self)
            if self.inner is not None:
                self.inner.connection_lost(exc)

    def request_started(self) -> None:
        self._cancel_timer()
        self.more_sent = False
        self._enter(SERVING)

    def waiting(self, waiting: bool) -> None:
        if waiting and self.state == SERVING:
            self._enter(WAITING)
        elif not waiting and self.state == WAITING:
            self._enter(SERVING)

    def response_sent(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.closing:
            self.transport.close()  # after a reload: the answer is out, the connection ends
        elif self.more_sent:
            self._enter(RECEIVING)
            self._start_timer()
        else:
            self._enter(IDLE)

    def close_when_done(self) -> None:
        if self.transport is None:
            return
        if self.state in (SILENT, IDLE):
            self.transport.close()
        else:
            self.closing = True  # the server's middleware also answers with Connection: close

    def abort(self) -> None:
        """Shed at the cap: closed at once, its place free for the connection that shed it."""
        self._cancel_timer()
        self.owner._forget(self)
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]

    def _enter(self, state: str) -> None:
        if self.state == CLOSED:
            return  # shed: its last callbacks change nothing
        self.owner._moved(self, self.state, state)
        self.state = state
        self.since = asyncio.get_running_loop().time()

    def _start_timer(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.owner.limits.header_timeout, self._header_timeout)

    def _header_timeout(self) -> None:
        self._timer = None
        self.owner.registry.count_refused("header_timeout")
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]

    def _idle_timeout(self) -> None:
        self._timer = None
        if self.transport is not None:
            self.transport.close()

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
        # asyncio listens with `backlog`, which is also how many it accepts in one go; the
        # kernel's queue is then made as long as the system allows, as Go's listeners have it:
        # a connection waiting there holds no file of ours, and while a flood keeps the queue
        # busy a scraper's connection is queued, not dropped (a retransmission a second later).
        self.socket.listen(socket.SOMAXCONN)
        if previous is not None:
            previous.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.socket.close()
