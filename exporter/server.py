"""HTTP: /metrics (Prometheus text or OpenMetrics, by the Accept header), /healthz, /."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from exporter.registry import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Registry
from exporter.sampler import Sampler

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


class Access:
    """What the server checks on every request; replaced whole on SIGHUP."""

    def __init__(self, web_config=None, max_requests: int = 40):
        self.web_config = web_config
        self.in_flight = asyncio.Semaphore(max_requests)


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


def quiet_bad_requests(registry: Registry) -> QuietBadRequests:
    """Install the filter on aiohttp's server logger (once per process); returns it."""
    server_log = logging.getLogger("aiohttp.server")
    for f in server_log.filters:
        if isinstance(f, QuietBadRequests):
            server_log.removeFilter(f)
    quiet = QuietBadRequests(registry)
    server_log.addFilter(quiet)
    return quiet


def make_app(registry: Registry, sampler: Sampler | None = None, access: Access | None = None) -> web.Application:
    access = access or Access()

    @web.middleware
    async def guard(request: web.Request, handler):
        config = access.web_config
        if config is not None and config.users and not config.authorised(request.headers.get("Authorization")):
            return web.Response(status=401, text="Unauthorized\n",
                                headers={"WWW-Authenticate": 'Basic realm="gpunet-exporter"'})
        if access.in_flight.locked():
            # node_exporter's --web.max-requests: shed load rather than queue scrapes.
            return web.Response(status=503, text="too many concurrent requests\n")
        async with access.in_flight:
            return await handler(request)

    async def metrics(request: web.Request) -> web.Response:
        openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
        gzipped = wants_gzip(request.headers.get("Accept-Encoding", ""))
        body = registry.render(openmetrics, gzipped)
        headers = {"Content-Type": OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(request: web.Request) -> web.Response:
        # Healthy while the fast tick keeps running; a wedged sampler fails liveness.
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
