"""HTTP: /metrics (Prometheus text or OpenMetrics, by the Accept header), /healthz, /."""

from __future__ import annotations

import time

from aiohttp import web

from exporter.registry import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Registry
from exporter.sampler import Sampler

INDEX = b"""<html><head><title>gpunet exporter</title></head><body><h1>gpunet exporter</h1>
<p><a href="/metrics">Metrics</a> &middot; <a href="/healthz">Health</a></p></body></html>
"""


def wants_openmetrics(accept: str) -> bool:
    # What Prometheus sends: "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;...".
    return any(part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(","))


def wants_gzip(accept_encoding: str) -> bool:
    return any(part.split(";")[0].strip() == "gzip" for part in accept_encoding.split(","))


def make_app(registry: Registry, sampler: Sampler | None = None) -> web.Application:
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

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", index)
    return app
