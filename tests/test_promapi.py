"""The Prometheus API client over real HTTP: bearer tokens sent, refusals and timeouts told
in one line, credentials never in a message."""

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpunet.promapi import Auth, PromError, PrometheusClient, redact

TOKEN = "tok-9f8e7d"


@pytest.fixture
async def api():
    seen = []

    async def query(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.Response(status=401, text="Unauthorized")
        form = await request.post()
        if form.get("query") == "slow":
            await asyncio.sleep(2)
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"instance": "n1:9845"}, "value": [float(form["time"]), "1"]}]}})

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    server = TestServer(app)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}", seen
    await server.close()


async def test_bearer_token_is_sent(api):
    url, seen = api
    async with PrometheusClient(url, Auth(bearer_token=TOKEN)) as client:
        data = await client.query("up", 1767225600)
    assert data["result"][0]["metric"]["instance"] == "n1:9845"
    assert seen == [f"Bearer {TOKEN}"]


async def test_wrong_token_is_refused_without_showing_it(api):
    url, _ = api
    async with PrometheusClient(url, Auth(bearer_token="nope-123")) as client:
        with pytest.raises(PromError) as err:
            await client.query("up", 1767225600)
    assert "unauthorised" in str(err.value) and "nope-123" not in str(err.value)


async def test_timeout_is_one_line(api):
    url, _ = api
    async with PrometheusClient(url, Auth(bearer_token=TOKEN), timeout=0.5) as client:
        with pytest.raises(PromError) as err:
            await client.query("slow", 1767225600)
    assert "no answer within" in str(err.value) and "\n" not in str(err.value)


def test_credentials_in_urls_are_redacted():
    assert redact("https://admin:hunter2@prom.example:9090/x") == "https://prom.example:9090/x"
    client = PrometheusClient("http://u:p4ss@127.0.0.1:9090")
    assert "p4ss" not in client.url
