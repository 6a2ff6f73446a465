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


@pytest.fixture
async def hostile():
    """A server answering the API's paths with an endless body, or with JSON of another shape."""
    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        chunk = b"x" * (1 << 20)
        try:
            while True:
                await resp.write(chunk)
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    async def wrong_shape(request: web.Request) -> web.Response:
        return web.json_response(["not", "an", "api", "answer"])

    async def success_but_odd(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": "oops"}})

    async def login_page(request: web.Request) -> web.Response:
        return web.Response(status=200, content_type="text/html",
                            text="<!DOCTYPE html>\n<html>\n<head><title>Sign in\n - SSO</title></head>\n"
                                 "<body><form>Login required</form></body>\n</html>\n")

    async def not_found_page(request: web.Request) -> web.Response:
        return web.Response(status=404, content_type="text/html",
                            text="<html>\n<body>\n<p>Error code: 404</p>\n</body>\n</html>\n")

    app = web.Application()
    app.router.add_post("/login/api/v1/query", login_page)
    app.router.add_post("/missing/api/v1/query", not_found_page)
    app.router.add_post("/endless/api/v1/query", endless)
    app.router.add_post("/list/api/v1/query", wrong_shape)
    app.router.add_route("*", "/odd/{tail:.*}", success_but_odd)
    server = TestServer(app)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


async def test_an_endless_answer_is_refused_at_the_limit(hostile, monkeypatch):
    import gpunet.promapi as promapi

    monkeypatch.setattr(promapi, "MAX_RESPONSE_BYTES", 8 << 20)  # the same check at a size a test can reach
    async with PrometheusClient(hostile + "/endless", Auth(), timeout=30) as client:
        with pytest.raises(PromError) as err:
            await client.query("up", 1767225600)
    assert "over 8 MiB" in str(err.value) and "\n" not in str(err.value)


async def test_json_that_is_no_api_answer_is_one_line(hostile):
    async with PrometheusClient(hostile + "/list", Auth()) as client:
        with pytest.raises(PromError) as err:
            await client.query("up", 1767225600)
    assert "no API response" in str(err.value)


@pytest.mark.parametrize(("where", "said"), [("/login", "HTTP 200, an HTML page titled 'Sign in - SSO'"),
                                              ("/missing", "HTTP 404, an HTML page,")])
async def test_a_web_page_instead_of_the_api_is_said_in_one_line(hostile, where, said):
    """A wrong URL or a proxy's login page answers HTML: said so in one line, with the status,
    not the page dumped on several."""
    async with PrometheusClient(hostile + where, Auth()) as client:
        with pytest.raises(PromError) as err:
            await client.query("up", 1767225600)
    message = str(err.value)
    assert said in message and "not a Prometheus API answer" in message and "\n" not in message, message


async def test_diagnose_against_an_engine_of_another_shape_is_one_line(hostile):
    import sys

    from procs import REPO

    # The server runs in this event loop: the command must not block it.
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "diagnoser.cli", "--prometheus", hostile + "/odd",
                                                "--since", "1h", cwd=REPO, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    stderr = err.decode()
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith("diagnose:"), line


@pytest.fixture
async def counted():
    """A server answering in gzip, as Prometheus does, and one refusing over a query limit."""
    async def gzipped(request: web.Request) -> web.Response:
        resp = web.json_response({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"instance": f"n{i}:9845"}, "value": [1767225600, "1"]} for i in range(500)]}})
        resp.enable_compression(web.ContentCoding.gzip)
        return resp

    async def refused(request: web.Request) -> web.Response:
        return web.json_response({"status": "error", "errorType": "execution", "error": "query processing would load "
                                  "too many samples into memory in query execution"}, status=422)

    app = web.Application()
    app.router.add_post("/gz/api/v1/query", gzipped)
    app.router.add_post("/limit/api/v1/query", refused)
    server = TestServer(app)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


async def test_bytes_on_the_wire_and_decoded_are_counted(counted):
    async with PrometheusClient(counted + "/gz") as client:
        data = await client.query("up", 1767225600)
    assert len(data["result"]) == 500
    assert client.requests == 1 and 0 < client.bytes_received < client.bytes_decoded / 5  # gzip of repetitive JSON


async def test_a_refusal_over_a_query_limit_is_told_apart(counted):
    from gpunet.promapi import PromLimitError

    async with PrometheusClient(counted + "/limit") as client:
        with pytest.raises(PromLimitError) as err:
            await client.query("up", 1767225600)
    assert "too many samples" in str(err.value)
    # The limit named for the warning, and not one on each series' points (a split by nodes helps).
    assert err.value.limit == "too many samples" and not err.value.per_series
