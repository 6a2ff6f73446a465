"""HTTP: /metrics (Prometheus text or OpenMetrics, by the Accept header), /healthz, /."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from exporter.connections import Connections, Limits
from exporter.registry import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Registry
from exporter.sampler import Sampler
from exporter.webconfig import WebConfig

log = logging.getLogger("gpunet.exporter")

INDEX = b"""<html><head><title>gpunet exporter</title></head><body><h1>gpunet exporter</h1>
<p><a href="/metrics">Metrics</a> &middot; <a href="/healthz">Health</a></p></body></html>
"""


def wants_openmetrics(accept: str) -> bool:
    # What Prometheus sends: "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;...".
    return any(part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(","))


def wants_gzip(accept_encoding: str) -> bool:
    return any(part.split(";")[0].strip() == "gzip" for part in accept_encoding.split(","))


MAX_REQUEST_BYTES = 16 * 1024  # a scrape has no body
WRITE_CHUNK = 64 * 1024  # a client that does not read holds one chunk of its body, not all of it
BCRYPT_THREADS = 2  # bcrypt checks running at once, each ~70 ms of a core at cost 10
MOST_CLIENTS = 64  # clients with password checks running or waiting; more get 503 at once


def client_of(remote: str | None) -> str:
    """Who a password check is counted against: the client's address, or its /64 for IPv6,
    where one host commonly holds a whole /64."""
    try:
        address = ipaddress.ip_address(remote or "")
    except ValueError:
        return remote or ""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # an IPv4 client of a dual-stack socket
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class PasswordChecks:
    """The bcrypt checks, fair between clients: one at a time per client, its other requests
    waiting their turn, first come first served; `threads` at once in all. So guessers from
    one address hold one thread at most, and a scraper elsewhere whose password is not
    verified yet is checked at once (before, guessers held both slots and every such login
    got 503). Guesses waiting their turn cost only their connections (which the connection
    cap sheds when it must: exporter/connections.py); answered 503 at once instead, 100
    guessers had the server answer a thousand guesses a second, scrapes queueing behind them
    on the event loop. A request whose very credentials are being checked waits for that
    check. At most `most_clients` clients at once: more get 503."""

    def __init__(self, threads: int = BCRYPT_THREADS, most_clients: int = MOST_CLIENTS):
        # bcrypt holds the GIL only briefly; its own threads keep it off the event loop and
        # off the default executor.
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gpunet-bcrypt")
        self.most_clients = most_clients
        self._turns: dict[str, asyncio.Lock] = {}  # per client with requests checking or waiting
        self._queued: dict[str, int] = {}  # how many
        self._running: dict[tuple[int, str | None], asyncio.Future[bool]] = {}  # (config, header) -> check

    async def check(self, config: WebConfig, header: str | None, client: str,
                    gone: Callable[[], bool]) -> bool | None:
        """True/False; None when too many clients are at it, or the request's connection is
        `gone` (shed, or closed by the client) by its turn: its check would be wasted."""
        key = (id(config), header)  # a check under a config replaced since is not shared
        if key in self._running:
            return await asyncio.shield(self._running[key])
        if client not in self._turns and len(self._turns) >= self.most_clients:
            return None
        turn = self._turns.setdefault(client, asyncio.Lock())  # asyncio's Lock: first come, first served
        self._queued[client] = self._queued.get(client, 0) + 1
        try:
            async with turn:
                if gone():
                    return None
                future = self._running.get(key)  # started meanwhile for another client
                if future is None:
                    future = self._start(config, header, key)
                # Shielded: a request that goes away does not cancel a check others wait for.
                return await asyncio.shield(future)
        finally:
            self._queued[client] -= 1
            if not self._queued[client]:
                del self._queued[client], self._turns[client]

    def _start(self, config: WebConfig, header: str | None, key: tuple[int, str | None]) -> asyncio.Future[bool]:
        future = asyncio.get_running_loop().run_in_executor(self.pool, config.verify, header)
        self._running[key] = future
        future.add_done_callback(lambda _: self._running.pop(key, None))
        return future

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Access:
    """What the server checks on every request; its web config is replaced whole on SIGHUP."""

    def __init__(self, web_config: WebConfig | None = None, max_requests: int = 40,
                 limits: Limits | None = None):
        self.in_flight = asyncio.Semaphore(max_requests)
        self.limits = limits or Limits()
        self.password_checks = PasswordChecks()
        self._web_config: WebConfig | None = None
        self.web_config = web_config

    @property
    def web_config(self) -> WebConfig | None:
        return self._web_config

    @web_config.setter
    def web_config(self, config: WebConfig | None) -> None:
        if config is not None and self._web_config is not None:
            # A reload: passwords verified under the previous file stay verified where the
            # user's hash is unchanged, so no scraper waits on bcrypt again (behind guessers).
            config.keep_verified(self._web_config)
        self._web_config = config
        self.bucket = TokenBucket(*config.rate_limit) if config is not None and config.rate_limit else None

    def close(self) -> None:
        self.password_checks.close()

    def known(self, header: str | None) -> bool | None:
        """Allowed or not, when that needs no bcrypt; None when `check_password` must run."""
        config = self.web_config
        return True if config is None else config.cached(header)

    async def check_password(self, header: str | None, remote: str | None,
                             gone: Callable[[], bool] = lambda: False) -> bool | None:
        """The bcrypt check, in its client's turn; None: answer 503 (PasswordChecks.check)."""
        config = self.web_config
        if config is None:
            return True
        return await self.password_checks.check(config, header, client_of(remote), gone)


class TokenBucket:
    """The web config's rate_limit: one request per `interval` seconds, bursts of `burst`."""

    def __init__(self, interval: float, burst: int):
        self.interval, self.burst = interval, burst
        self.tokens, self.updated = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) / self.interval)
        self.updated = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class SlowClientSafeBody(web.StreamResponse):
    """A body sent in chunks, each when the client has taken the one before: a client that
    does not read holds one chunk in memory instead of the whole body (each writer copies what
    the socket does not take), and is cut after `write_timeout`. aiohttp sends it after the
    handler and its middleware returned."""

    # The headers go out with the first chunk, in one write (one segment), as aiohttp's own
    # Response sends them; a StreamResponse sends them apart by default.
    _send_headers_immediately = False

    def __init__(self, body: bytes, write_timeout: float, on_timeout: Callable[[], None]):
        super().__init__()
        self.body_bytes = memoryview(body)
        self.content_length = len(body)
        self.write_timeout = write_timeout
        self.on_timeout = on_timeout

    async def write_eof(self, data: bytes = b"") -> None:
        if self.prepared and not self._eof_sent and not self._must_be_empty_body:  # HEAD: headers only
            try:
                async with asyncio.timeout(self.write_timeout):
                    for offset in range(0, len(self.body_bytes), WRITE_CHUNK):
                        await self.write(self.body_bytes[offset:offset + WRITE_CHUNK])  # waits for the client
                    await super().write_eof(data)
            except TimeoutError:
                self.on_timeout()
                transport = self._req.transport if self._req is not None else None
                if transport is not None:
                    transport.abort()
                raise ConnectionResetError("write timeout") from None  # aiohttp's "client went away"
            return
        await super().write_eof(data)


class BadRequestLog(logging.LoggerAdapter):
    """The logger aiohttp's connection handlers are given (AppRunner(logger=...)): every
    request aiohttp cannot parse is logged through it with its error. aiohttp logs garbage,
    binary and a TLS hello on the plain port (a bad method in a connection's first request)
    at debug, which a logging filter never sees at the default level, and other malformed
    requests at ERROR with a traceback, with which anyone who can connect could fill the
    disk. Here each is counted (gpunet_exporter_http_bad_requests_total) and said in one line
    at debug; aiohttp answers it 400 all the same. Everything else goes to aiohttp's logger."""

    def __init__(self, registry: Registry):
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.registry = registry

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None, **kwargs: Any) -> None:
        error = exc_info[1] if isinstance(exc_info, tuple) else exc_info
        if isinstance(error, HttpProcessingError):
            self.registry.count_bad_request()
            if log.isEnabledFor(logging.DEBUG):
                said = str(msg) % args if args else str(msg)
                log.debug("bad request: %s: %s", said, " ".join(str(error).split())[:200])
            return
        super().log(level, msg, *args, exc_info=exc_info, **kwargs)


class OneLineAcceptErrors(logging.Filter):
    """asyncio logs a failed accept() (out of files) at ERROR with a traceback, at most once a
    second while it backs off: one line says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("socket.accept() out of system resource") and record.exc_info:
            record.msg, record.args = f"socket.accept() failed: {record.exc_info[1]}; retrying in a second", ()
            record.exc_info, record.exc_text = None, None
        return True


def quiet_server_logs(registry: Registry) -> BadRequestLog:
    """Failed accepts in one line on asyncio's logger (installed once per process); returns
    the logger to give aiohttp's connection handlers, which counts bad requests."""
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, OneLineAcceptErrors) for f in asyncio_log.filters):
        asyncio_log.addFilter(OneLineAcceptErrors())
    return BadRequestLog(registry)


def make_app(registry: Registry, sampler: Sampler | None = None, access: Access | None = None,
             connections: Connections | None = None) -> web.Application:
    access = access or Access()

    def refuse(reason: str, status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
        registry.count_refused(reason)
        return web.Response(status=status, text=text, headers=headers)

    @web.middleware
    async def guard(request: web.Request, handler):
        if connections is not None:
            connections.request_started(request.transport)
        response = await checked(request, handler)
        if access.web_config is not None and not response.prepared:
            response.headers.update(access.web_config.headers)
        if connections is not None and connections.closing(request.transport) and not response.prepared:
            response.force_close()  # a reload came: "Connection: close", the client reconnects
        return response

    async def checked(request: web.Request, handler) -> web.StreamResponse:
        config = access.web_config
        if access.bucket is not None and not access.bucket.take():
            return refuse("rate_limit", 429, "rate limit exceeded\n")
        if config is not None and config.allowed_sans:
            transport = request.transport
            if not config.allows_peer(transport.get_extra_info("peercert") if transport else None):
                return refuse("client_cert", 403, "client certificate not allowed\n")
        # The password before a request slot: a check waiting for bcrypt holds no slot that
        # a scrape with verified credentials needs.
        header = request.headers.get("Authorization")
        allowed = access.known(header)
        if allowed is None:
            allowed = await password_checked(request, header)
        if allowed is None:
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=503)  # gone while it waited its turn: not refused, not counted
            return refuse("auth_busy", 503, "too many password checks at once\n", {"Retry-After": "1"})
        if not allowed:
            return web.Response(status=401, text="Unauthorized\n",
                                headers={"WWW-Authenticate": 'Basic realm="gpunet-exporter"'})
        if access.in_flight.locked():
            # node_exporter's --web.max-requests: shed load rather than queue scrapes.
            return refuse("request_limit", 503, "too many concurrent requests\n")
        # The slot covers the handler; a body is sent after it is released
        # (SlowClientSafeBody), so clients that do not read hold connections (capped, timed
        # out) but never the slots honest scrapes need.
        async with access.in_flight:
            return await handler(request)

    async def password_checked(request: web.Request, header: str | None) -> bool | None:
        transport = request.transport
        if connections is not None:
            connections.waiting(transport, True)  # it can be shed at the cap meanwhile
        try:
            return await access.check_password(header, request.remote,
                                               lambda: transport is None or transport.is_closing())
        finally:
            if connections is not None:
                connections.waiting(transport, False)

    async def metrics(request: web.Request) -> web.StreamResponse:
        if sampler is not None and sampler.scrapes is not None and request.method == "GET":  # not a HEAD probe
            sampler.scrapes.seen(request.remote or "", time.monotonic())
        openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
        gzipped = wants_gzip(request.headers.get("Accept-Encoding", ""))
        response = SlowClientSafeBody(registry.render(openmetrics, gzipped), access.limits.write_timeout,
                                      lambda: registry.count_refused("write_timeout"))
        response.headers["Content-Type"] = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        if gzipped:
            response.headers["Content-Encoding"] = "gzip"
        return response

    async def healthz(request: web.Request) -> web.Response:
        # Healthy once the first fast tick ran and while the fast tick keeps running; a wedged
        # sampler fails liveness. (The server listens before the first tick, which may wait
        # out a hung source's time limit.)
        if sampler is not None and not sampler.first_fast_tick_done.is_set():
            return web.Response(status=503, text="starting: the first tick has not finished\n")
        if sampler is not None:
            age = time.monotonic() - sampler.last_fast_tick
            if age > max(10 * sampler.fast_interval, 5.0):
                return web.Response(status=503, text=f"fast tick stalled for {age:.1f}s\n")
        return web.Response(text="ok\n")

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=INDEX, content_type="text/html")

    app = web.Application(middlewares=[guard], client_max_size=MAX_REQUEST_BYTES)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", index)
    return app
