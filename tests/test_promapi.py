"""The Prometheus API client over real HTTP: bearer tokens sent, refusals and timeouts told
in one line, credentials never in a message."""

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpunet.promapi import MAX_RESPONSE_BYTES, Auth, PromError, PrometheusClient, redact

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

    async def nested(request: web.Request) -> web.Response:
        return web.json_response(text="[" * 100_000 + "]" * 100_000)

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
    app.router.add_post("/nested/api/v1/query", nested)
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


@pytest.fixture
async def endless_ranges():
    """A Prometheus that lists its nodes, answers every instant query with nothing, and
    streams every range query's answer without end (a matrix that never closes): plain, and
    gzip (a few KB on the wire per MB decoded)."""
    nodes = [f"node-{i:03d}:9845" for i in range(2)]
    series = b'{"metric":{"instance":"node-001:9845","device":"mlx5_0"},"values":[[1767225600,"1"]]},'
    chunk = b'{"status":"success","data":{"resultType":"matrix","result":[' + series * ((1 << 20) // len(series))
    answered = {"plain": 0, "gzip": 0}

    async def label_values(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": nodes})

    async def instant(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

    async def endless(request: web.Request) -> web.StreamResponse:
        gzipped = sum(answered.values()) % 2 == 1
        answered["gzip" if gzipped else "plain"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/json",
                                           **({"Content-Encoding": "gzip"} if gzipped else {})})
        squeeze = zlib.compressobj(1, zlib.DEFLATED, 31)
        try:
            await resp.prepare(request)
            while True:
                await resp.write(squeeze.compress(chunk) + squeeze.flush(zlib.Z_SYNC_FLUSH) if gzipped else chunk)
        except (ConnectionResetError, ConnectionError):
            pass
        return resp

    app = web.Application()
    app.router.add_route("*", "/api/v1/label/{name}/values", label_values)
    app.router.add_route("*", "/api/v1/query", instant)
    app.router.add_route("*", "/api/v1/query_range", endless)
    server = TestServer(app)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}", answered
    await server.close()


def run_measured(cmd: list[str], limit_kib: int, timeout: float) -> tuple[int, str, int]:
    """(exit status, stderr, peak RSS in KiB as the kernel counts it) of `cmd`, killed once
    its RSS passes `limit_kib` (a run that would take the machine's memory is stopped there).
    The peak is the process's own high-water mark (VmHWM), read while it runs: its rusage
    ru_maxrss starts from the RSS of the process that forked it (the kernel carries the
    high-water mark across exec), which under pytest-xdist is a worker's, a gigabyte at times."""
    from procs import REPO

    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        peak = 0
        while True:
            try:  # read before wait4 reaps it: a zombie's status holds no memory lines
                with open(f"/proc/{proc.pid}/status") as f:
                    memory = {l.split(":")[0]: int(l.split()[1]) for l in f if l.startswith(("VmRSS:", "VmHWM:"))}
            except (OSError, ValueError):
                memory = {}
            peak = max(peak, memory.get("VmHWM", 0))
            if memory.get("VmRSS", 0) > limit_kib or time.monotonic() > deadline:
                proc.kill()
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return proc.returncode, err.read().decode(), peak


async def test_diagnose_against_endless_answers_stays_under_a_gigabyte(endless_ranges):
    """Every range query streams without end, all of them in flight at once: each answer is
    refused at its cap, and the diagnose process (its peak RSS) stays under 1 GB until it
    ends, in one line."""
    url, answered = endless_ranges
    cmd = [sys.executable, "-m", "diagnoser.cli", "--prometheus", url, "--since", "1h"]
    # The server runs in this event loop: the command is waited for on a thread.
    status, stderr, peak_kib = await asyncio.get_running_loop().run_in_executor(None, run_measured, cmd, 1 << 20, 240)
    assert peak_kib < 1 << 20, f"peak RSS {peak_kib >> 10} MiB (killed past 1 GiB); {answered}"
    assert answered["plain"] >= 8 and answered["gzip"] >= 8, answered  # all its queries were in flight
    assert status == 1 and "Traceback" not in stderr, stderr
    assert f"over {MAX_RESPONSE_BYTES >> 20} MiB" in stderr.strip().splitlines()[-1], stderr
    print(f"peak RSS {peak_kib >> 10} MiB over {answered} endless answers")


# An answer just under the cap on what a query may return: every answer of this size is read
# in full and parsed, none refused.
NEAR_CAP = MAX_RESPONSE_BYTES - (64 << 10)


def _near_cap(head: bytes, item: Callable[[int], bytes], tail: bytes) -> bytes:
    """head, items 0, 1, 2... joined by commas, tail: as many items as fit in NEAR_CAP."""
    parts, size, i = [head], len(head) + len(tail), 0
    while True:
        piece = item(i) + b","
        if size + len(piece) > NEAR_CAP:
            break
        parts.append(piece)
        size, i = size + len(piece), i + 1
    return b"".join(parts).rstrip(b",") + tail


@pytest.fixture(params=["points", "tiny"])
async def near_cap_answers(request):
    """A Prometheus of two nodes scraped every 5 s that answers every other query, range,
    instant or series, with a well-formed answer just under the cap: `points`, series with
    a point at every time asked for, and a label value of their own for every label the
    diagnoser groups by; `tiny`, series of one point each (a hundred thousand and more),
    half of them on instances that were never listed."""
    nodes = [f"node-{i:03d}:9845" for i in range(2)]
    labels = ("device", "gpu", "network_state", "speed", "workload", "source", "namespace", "priority")
    answered = {"range": 0, "instant": 0, "series": 0}
    bodies: dict[tuple, bytes] = {}

    def metric(i: int) -> bytes:
        instance = nodes[i % 2] if request.param == "points" or i % 2 == 0 else f"h{i}"
        return json.dumps({"instance": instance, **dict.fromkeys(labels, f"{i}")},
                          separators=(",", ":")).encode()

    metrics = [metric(i) for i in range(NEAR_CAP // 100)]  # more than fit: every body takes from here

    def matrix(start: float, end: float, step: float) -> bytes:
        key = (start, end, step)
        if key not in bodies:  # built once per range asked (every time asked for, a point)
            times = [start + k * step for k in range(int(round((end - start) / step)) + 1)]
            points = b",".join(b'[%.3f,"1"]' % t for t in (times if request.param == "points" else times[:1]))
            bodies[key] = _near_cap(b'{"status":"success","data":{"resultType":"matrix","result":[',
                                    lambda i: b'{"metric":' + metrics[i] + b',"values":[' + points + b"]}", b"]}}")
        return bodies[key]

    vector = _near_cap(b'{"status":"success","data":{"resultType":"vector","result":[',
                       lambda i: b'{"metric":' + metrics[i] + b',"value":[1767225600,"1"]}', b"]}}")
    series = _near_cap(b'{"status":"success","data":[', metrics.__getitem__, b"]}")

    def answer(body: bytes) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    async def label_values(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": nodes})

    async def instant(request: web.Request) -> web.Response:
        form = await request.post()
        expr, at = form["query"], float(form["time"])
        # Enough truth for the diagnoser to find the data and its scrape interval (5 s).
        if expr.startswith("max by (instance) (count_over_time("):
            result = [{"metric": {"instance": n}, "value": [at, "361"]} for n in nodes]
        elif expr.startswith(("max by (instance) (timestamp(", "max(timestamp(")):
            result = [{"metric": {"instance": n}, "value": [at, f"{at:.3f}"]} for n in nodes]
        elif re.match(r"\w+\{instance=~", expr):
            span = int(re.search(r"\[(\d+)ms\]", expr).group(1)) / 1000
            samples = [[at - span + 5 * k, "1"] for k in range(int(span / 5) + 1)]
            return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"instance": nodes[0]}, "values": samples}]}})
        else:
            answered["instant"] += 1
            return answer(vector)
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    async def query_range(request: web.Request) -> web.Response:
        form = await request.post()
        answered["range"] += 1
        return answer(matrix(float(form["start"]), float(form["end"]), float(form["step"])))

    async def series_list(request: web.Request) -> web.Response:
        answered["series"] += 1
        return answer(series)

    async def metadata(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/label/{name}/values", label_values)
    app.router.add_post("/api/v1/query", instant)
    app.router.add_post("/api/v1/query_range", query_range)
    app.router.add_route("*", "/api/v1/series", series_list)
    app.router.add_get("/api/v1/metadata", metadata)
    server = TestServer(app)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}", answered
    await server.close()


async def test_diagnose_against_answers_just_under_the_cap_stays_under_a_gigabyte(near_cap_answers):
    """Every query answered in full just under the cap, all of them in flight: the answers
    are folded in as they come (only those in flight are held), and the rows kept are bounded
    (series on instances not asked for dropped, the keys of a query capped): the diagnose
    process stays under 1 GB and ends with a report or a one-line error."""
    url, answered = near_cap_answers
    cmd = [sys.executable, "-m", "diagnoser.cli", "--prometheus", url, "--since", "30m"]
    status, stderr, peak_kib = await asyncio.get_running_loop().run_in_executor(None, run_measured, cmd, 1 << 20, 600)
    assert peak_kib < 1 << 20, f"peak RSS {peak_kib >> 10} MiB (killed past 1 GiB); {answered}"
    assert answered["range"] >= 37 and answered["instant"] >= 8, answered  # a whole diagnosis' queries
    assert "Traceback" not in stderr, stderr
    assert "warning: the server answered" in stderr, stderr  # what was dropped is said
    last = stderr.strip().splitlines()[-1]
    assert status == 0 or (status == 1 and last.startswith("diagnose:")), stderr
    print(f"peak RSS {peak_kib >> 10} MiB over {answered} answers just under the cap, exit {status}: {last}")


async def test_json_nested_deeper_than_python_recurses_is_one_line(hostile):
    async with PrometheusClient(hostile + "/nested") as client:
        with pytest.raises(PromError) as err:
            await client.query("up", 1767225600)
    assert "\n" not in str(err.value) and "HTTP 200" in str(err.value), err.value


@pytest.fixture
async def small_limit():
    """A server holding one series, a sample every 15 s, that refuses any query over more
    than 20 minutes of it as too many samples (as VictoriaMetrics' -search.maxSamplesPerQuery)."""
    start = 1767225600.0
    stamps = [start + 15 * i for i in range(2 * 240 + 1)]

    async def label_values(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": ["gpunet_nic_up"]})

    async def metadata(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {}})

    async def query(request: web.Request) -> web.Response:
        form = await request.post()
        at, span = float(form["time"]), int(re.search(r"\[(\d+)ms\]", form["query"]).group(1)) / 1000
        if span > 1200:
            return web.json_response({"status": "error", "errorType": "execution", "error": "query processing would "
                                      "load too many samples into memory in query execution"}, status=422)
        values = [[t, "1"] for t in stamps if at - span < t <= at]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "gpunet_nic_up", "instance": "n1:9845", "device": "ib0"}, "values": values}]
            if values else []}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/label/{name}/values", label_values)
    app.router.add_get("/api/v1/metadata", metadata)
    app.router.add_post("/api/v1/query", query)
    server = TestServer(app)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}", stamps
    await server.close()


async def test_export_halves_a_query_refused_over_a_limit(small_limit, tmp_path):
    """An hour's query refused over the server's limit is split in time until it passes:
    every sample exported, once."""
    import gzip

    from procs import REPO

    url, stamps = small_limit
    out = tmp_path / "x.om.gz"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpunet.trace_cli", "export", "--prometheus", url, "--start", f"{stamps[0]:.0f}",
        "--end", f"{stamps[-1]:.0f}", str(out), cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = [l for l in gzip.decompress(out.read_bytes()).decode().splitlines() if not l.startswith("#")]
    assert [float(l.rsplit(" ", 1)[1]) for l in lines] == stamps
