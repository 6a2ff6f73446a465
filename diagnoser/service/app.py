"""The service's HTTP side (docs/service.md): /metrics, health, Alertmanager's webhook and the
reports. TLS and basic auth as the exporter's (--web.config.file, exporter/webconfig.py):
the same checks through the exporter's Access."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from diagnoser.render import render
from diagnoser.render.html_report import render_html
from diagnoser.service import webhook
from diagnoser.service.history import History
from diagnoser.service.publish import Metrics
from diagnoser.service.revive import add_charts, report_from_dict
from diagnoser.service.runner import Runner
from exporter.server import Access
from gpunet.window import parse_duration, rfc3339

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LIST_LIMIT = 500  # reports on one list page


def make_app(runner: Runner, history: History, metrics: Metrics, access: Access | None = None) -> web.Application:
    access = access or Access()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        config = access.web_config
        if config is not None and config.allowed_sans:
            transport = request.transport
            if not config.allows_peer(transport.get_extra_info("peercert") if transport else None):
                return web.Response(status=403, text="client certificate not allowed\n")
        header = request.headers.get("Authorization")
        allowed = access.known(header)
        if allowed is None:
            allowed = await access.check_password(header, request.remote)
        if allowed is None:
            return web.Response(status=503, text="too many password checks at once\n", headers={"Retry-After": "1"})
        if not allowed:
            return web.Response(status=401, text="Unauthorized\n",
                                headers={"WWW-Authenticate": 'Basic realm="gpunet-diagnoser"'})
        response = await handler(request)
        if config is not None:
            response.headers.update(config.headers)
        return response

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthy(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def ready(request: web.Request) -> web.Response:
        if not runner.ready.is_set():
            return web.Response(status=503, text="starting: the first run has not finished\n")
        return web.Response(text="ok\n")

    async def alertmanager(request: web.Request) -> web.Response:
        status, text = await _webhook(request)
        metrics.webhook.labels(str(status)).inc()
        return web.Response(status=status, text=text + "\n")

    async def _webhook(request: web.Request) -> tuple[int, str]:
        body = await request.content.read(webhook.MAX_BODY_BYTES + 1)
        if len(body) > webhook.MAX_BODY_BYTES:
            return 413, f"payload over {webhook.MAX_BODY_BYTES} bytes"
        try:
            group = webhook.parse(body)
        except webhook.PayloadError as e:
            return 400, f"not an Alertmanager webhook payload (version 4): {e}"
        if not group.firing:
            return 200, "resolved: nothing to diagnose"
        outcome = runner.submit(group.group_key, group.jobs, group.earliest_start)
        if outcome == "duplicate":
            return 200, "this alert group is already queued or being diagnosed"
        if outcome == "full":
            return 429, f"queue full ({runner.args.webhook_queue} diagnoses waiting)"
        return 202, "queued: " + (", ".join(group.jobs) or "every job")

    def _filters(request: web.Request) -> dict:
        since = request.query.get("since")
        try:
            after = time.time() - parse_duration(since) if since else None
        except ValueError as e:
            raise web.HTTPBadRequest(text=f"since: {e}\n") from None
        return {"job": request.query.get("job") or None, "cls": request.query.get("class") or None, "since": after}

    async def reports(request: web.Request) -> web.Response:
        entries = history.entries(**_filters(request), limit=LIST_LIMIT)
        if request.query.get("format") == "json":
            return web.json_response([e.to_dict() for e in entries])
        e = html.escape
        rows = "".join(
            f'<tr><td><a href="/reports/{x.id}">{x.id}</a></td><td>{e(rfc3339(x.created))}</td><td>{e(x.job)}</td>'
            f"<td>{e(x.trigger)}</td><td>{e(x.verdict)}</td>"
            f"<td>{'<br>'.join(e(f.summary) for f in x.findings)}</td></tr>" for x in entries)
        page = ("<!doctype html><html><head><meta charset=utf-8><title>gpunet diagnoses</title></head><body>"
                f"<h1>gpunet diagnoses</h1><p>{len(entries)} reports, newest first.</p><table>"
                "<tr><th>report</th><th>created</th><th>job</th><th>trigger</th><th>verdict</th><th>findings</th></tr>"
                f"{rows}</table></body></html>")
        return web.Response(text=page, content_type="text/html")

    async def latest(request: web.Request) -> web.Response:
        entry = history.latest(request.query.get("job") or None)
        if entry is None:
            raise web.HTTPNotFound(text="no report" + (f" of job {request.query['job']}" if "job" in request.query
                                                       else "") + " yet\n")
        raise web.HTTPFound(f"/reports/{entry.id}")

    async def one(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        stem, dot, fmt = name.partition(".")
        if not stem.isdigit() or fmt not in ("", "json", "md"):
            raise web.HTTPNotFound(text=f"no report {name}: /reports/<id>, <id>.json or <id>.md\n")
        document = history.document(int(stem))
        if document is None:
            raise web.HTTPNotFound(text=f"no report {stem} (deleted past --retention, or never kept)\n")
        if fmt == "json":
            return web.Response(text=document, content_type="application/json")
        report = report_from_dict(json.loads(document))
        if fmt == "md":
            return web.Response(text=render(report, "markdown"), content_type="text/markdown")
        return web.Response(text=render_html(add_charts(report, history.charts(int(stem)))), content_type="text/html")

    app = web.Application(middlewares=[guard], client_max_size=webhook.MAX_BODY_BYTES)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_post("/api/v1/alertmanager", alertmanager)
    app.router.add_get("/reports", reports)
    app.router.add_get("/reports/latest", latest)
    app.router.add_get("/reports/{name}", one)
    return app
