"""HTTP: /metrics (Prometheus text or OpenMetrics, by the Accept header), /healthz, /."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

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
PASSWORD_CHECKS = 2  # bcrypt checks at once; more get 503 at once instead of queueing behind guessers


class Access:
    """What the server checks on every request; its web config is replaced whole on SIGHUP."""

    def __init__(self, web_config: WebConfig | None = None, max_requests: int = 40,
                 limits: Limits | None = None):
        self.in_flight = asyncio.Semaphore(max_requests)
        self.limits = limits or Limits()
        self.password_checks = asyncio.Semaphore(PASSWORD_CHECKS)
        # bcrypt holds the GIL only briefly; its own threads keep it off the event loop and
        # off the default executor.
        self.bcrypt_pool = ThreadPoolExecutor(PASSWORD_CHECKS, thread_name_prefix="gpunet-bcrypt")
        self.web_config = web_config

    @property
    def web_config(self) -> WebConfig | None:
        return self._web_config

    @web_config.setter
    def web_config(self, config: WebConfig | None) -> None:
        self._web_config = config
        self.bucket = TokenBucket(*config.rate_limit) if config is not None and config.rate_limit else None

    def close(self) -> None:
        self.bcrypt_pool.shutdown(wait=False, cancel_futures=True)

    async def authorised(self, header: str | None) -> bool | None:
        """True/False; None when the password checks are all busy (answer 503)."""
        config = self.web_config
        if config is None:
            return True
        known = config.cached(header)
        if known is not None:
            return known
        if self.password_checks.locked():
            return None
        async with self.password_checks:
            return await asyncio.get_running_loop().run_in_executor(self.bcrypt_pool, config.verify, header)


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


class QuietBadRequests(logging.Filter):
    """aiohttp logs every request it cannot parse at ERROR with a traceback: anyone who can
    connect could fill the disk with garbage. Such requests are answered 400 by aiohttp all
    the same; here they are counted (gpunet_exporter_http_bad_requests_total) and logged
    once each at debug, in one line. Errors of the exporter's own handlers still log."""

    def __init__(self, registry: Registry):
        super().__init__()
        self.registry = registry

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            self.registry.count_bad_request()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("bad request: %s: %s", record.getMessage(), " ".join(str(error).split())[:200])
            return False
        return True


class OneLineAcceptErrors(logging.Filter):
    """asyncio logs a failed accept() (out of files) at ERROR with a traceback, at most once a
    second while it backs off: one line says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("socket.accept() out of system resource") and record.exc_info:
            record.msg, record.args = f"socket.accept() failed: {record.exc_info[1]}; retrying in a second", ()
            record.exc_info, record.exc_text = None, None
        return True


def quiet_server_logs(registry: Registry) -> QuietBadRequests:
    """Install the filters (once per process): bad requests counted, not logged, on aiohttp's
    server logger; failed accepts in one line on asyncio's. Returns the first."""
    server_log = logging.getLogger("aiohttp.server")
    for f in server_log.filters:
        if isinstance(f, QuietBadRequests):
            server_log.removeFilter(f)
    quiet = QuietBadRequests(registry)
    server_log.addFilter(quiet)
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, OneLineAcceptErrors) for f in asyncio_log.filters):
        asyncio_log.addFilter(OneLineAcceptErrors())
    return quiet


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
        try:
            response = await checked(request, handler)
            if access.web_config is not None and not response.prepared:
                response.headers.update(access.web_config.headers)
            return response
        finally:
            if connections is not None:
                connections.request_finished(request.transport)

    async def checked(request: web.Request, handler) -> web.StreamResponse:
        config = access.web_config
        if access.bucket is not None and not access.bucket.take():
            return refuse("rate_limit", 429, "rate limit exceeded\n")
        if access.in_flight.locked():
            # node_exporter's --web.max-requests: shed load rather than queue scrapes.
            return refuse("request_limit", 503, "too many concurrent requests\n")
        # The slot covers the checks (the password check included) and the handler; a body
        # is sent after it is released (SlowClientSafeBody), so clients that do not read hold
        # connections (capped, timed out) but never the slots honest scrapes need.
        async with access.in_flight:
            if config is not None and config.allowed_sans:
                transport = request.transport
                if not config.allows_peer(transport.get_extra_info("peercert") if transport else None):
                    return refuse("client_cert", 403, "client certificate not allowed\n")
            allowed = await access.authorised(request.headers.get("Authorization"))
            if allowed is None:
                return refuse("auth_busy", 503, "too many password checks at once\n", {"Retry-After": "1"})
            if not allowed:
                return web.Response(status=401, text="Unauthorized\n",
                                    headers={"WWW-Authenticate": 'Basic realm="gpunet-exporter"'})
            return await handler(request)

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
