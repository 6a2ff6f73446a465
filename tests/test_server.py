"""/metrics over real HTTP: content negotiation, gzip, health, and no hardware reads per scrape."""

import asyncio
import gzip
import os
import shutil
import subprocess

import pytest
from aiohttp.test_utils import TestClient, TestServer
from conftest import FIXTURES
from exporter_harness import Node
from procs import REPO, exporter_command
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from exporter.inventory import InventoryOptions
from exporter.registry import Registry
from exporter.root import Root
from exporter.sampler import Sampler
from exporter.server import make_app

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
                     "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


@pytest.fixture
async def client():
    registry = Registry("roce-mlx5")
    sampler = Sampler(Root(FIXTURES / "roce-mlx5"), registry, InventoryOptions())
    sampler.slow_tick()
    sampler.fast_tick()
    async with TestClient(TestServer(make_app(registry, sampler))) as c:
        c.sampler = sampler
        yield c


async def test_text_format_by_default(client):
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    body = await resp.text()
    assert 'gpunet_nic_transmit_bytes_total{device="ens1f0np0"}' in body


async def test_openmetrics_when_prometheus_asks_for_it(client):
    resp = await client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    body = await resp.text()  # aiohttp undoes the gzip
    assert body.endswith("# EOF\n")
    families = {f.name: f for f in parse_openmetrics(body)}
    assert families["gpunet_nic_transmit_bytes"].type == "counter"
    assert families["gpunet_nic_info"].type == "gauge"
    # # UNIT where the name ends with one (the parser checks that it is the name's suffix)
    units = {name: f.unit for name, f in families.items()}
    assert units["gpunet_nic_transmit_bytes"] == "bytes"
    assert units["gpunet_nic_link_speed_bytes_per_second"] == "bytes_per_second"
    assert units["gpunet_exporter_collector_duration_seconds"] == "seconds"
    assert units["gpunet_nic_info"] == "" and units["gpunet_nic_pfc_pause_frames"] == ""
    text = await (await client.get("/metrics")).text()
    assert "# UNIT" not in text


async def test_gzip_is_real_gzip(client):
    resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert resp.headers["Content-Encoding"] == "gzip"
    assert b"gpunet_nic_info" in gzip.decompress(await resp.read())


async def test_scrapes_never_read_the_machine(client):
    """A scrape renders published samples: without ticks, nothing changes however often it is read."""
    first = await (await client.get("/metrics")).text()
    calls = []
    wire = client.sampler.collector("wire")
    original = wire.collect
    wire.collect = lambda *a: calls.append(a) or original(*a)
    bodies = await asyncio.gather(*(client.get("/metrics") for _ in range(50)))
    texts = {await b.text() for b in bodies}
    assert texts == {first} and calls == []


async def test_samples_that_cannot_be_made_cost_their_series_and_are_logged_once(client, caplog):
    """A collector whose samples are made at the scrape (live_samples) and raise: every scrape
    still answers, without them; the failure is logged at the first scrape, not at each, and
    that they are made again is logged once when they are."""
    from exporter.samples import Sample
    from gpunet.contract import GPU_UP

    broken = {"now": True}

    def make():
        if broken["now"]:
            raise ZeroDivisionError("a bug in making them")
        return [Sample(GPU_UP, ("9",), 1.0)]  # a node without GPUs: no other collector makes it

    registry = client.sampler.registry

    async def scrape() -> str:
        registry.publish("made_at_scrape", [], 0.0, 0, live=make)  # new generation: rendered afresh
        resp = await client.get("/metrics")
        assert resp.status == 200
        return await resp.text()

    caplog.set_level("INFO", logger="gpunet.exporter")
    for _ in range(3):
        assert "gpunet_nic_info" in await scrape()
    failures = [r for r in caplog.records if "made_at_scrape" in r.getMessage() and r.levelname == "ERROR"]
    assert len(failures) == 1 and "ZeroDivisionError" in failures[0].exc_text
    broken["now"] = False
    for _ in range(2):
        assert 'gpunet_gpu_up{gpu="9"} 1.0' in await scrape()
    again = [r for r in caplog.records if "made_at_scrape" in r.getMessage() and r.levelname == "INFO"]
    assert len(again) == 1


async def test_healthz_and_unknown_paths(client):
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/nope")).status == 404
    assert (await client.post("/metrics")).status == 405


@pytest.mark.parametrize("name", ["roce-mlx5", "h100-throttled", "ib-mlx5", "bnxt", "e810", "misconfigured-mlx5"])
def test_snapshot_of_a_node_reproduces_its_scrape(tmp_path, name):
    out = tmp_path / "snap"
    result = subprocess.run(exporter_command("--root", str(FIXTURES / name), "snapshot", str(out)),
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    original = Node(FIXTURES / name).tick(now=0.0).tick(slow=False, now=1.0).stable_text()
    copy = Node(out).tick(now=0.0).tick(slow=False, now=1.0).stable_text()
    assert copy.replace('root="snap"', f'root="{name}"') == original


@pytest.mark.skipif(os.geteuid() != 0, reason="reads every sysfs attribute of the live machine")
def test_snapshot_of_the_live_machine_is_a_working_fixture(tmp_path):
    out = tmp_path / "live"
    result = subprocess.run(exporter_command("snapshot", str(out)), cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    live = Node("/", exclude=None).tick()
    snap = Node(out, exclude=None).tick()
    live_devices = {dict(k)["device"] for k in live.series("gpunet_nic_info")}
    assert {dict(k)["device"] for k in snap.series("gpunet_nic_info")} == live_devices
    assert snap.value("gpunet_exporter_collector_up", collector="tcp") == 1.0
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=snap.text(), capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_daemon_ticks_on_time_and_stops_on_sigterm(tmp_path):
    import time

    from procs import http_get, start_exporter
    from prometheus_client.parser import text_string_to_metric_families

    proc, url = start_exporter(tmp_path, "--root", str(FIXTURES / "roce-mlx5"), "--fast-interval", "0.1",
                               "--slow-interval", "0.5")
    try:
        def ticks():
            body = http_get(url + "/metrics")[2].decode()
            return {s.labels["tick"]: s.value for f in text_string_to_metric_families(body)
                    for s in f.samples if s.name == "gpunet_exporter_ticks_total"}
        first, t0 = ticks(), time.monotonic()
        time.sleep(3.0)
        second, t1 = ticks(), time.monotonic()
        fast_rate = (second["fast"] - first.get("fast", 0)) / (t1 - t0)
        slow_rate = (second["slow"] - first.get("slow", 0)) / (t1 - t0)
        assert 8 <= fast_rate <= 10.5, fast_rate  # 10 per second, less what the ticks themselves take
        assert 1.6 <= slow_rate <= 2.4, slow_rate  # 6 or 7 ticks in 3 s, by the phase
    finally:
        started = time.monotonic()
        code = proc.stop(timeout=5)
        assert time.monotonic() - started < 5 and code == 0, proc.log()


def tls_client_hello() -> bytes:
    """The first bytes a TLS client sends: what a scraper set to https sends a plain port."""
    import ssl

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def test_malformed_requests_are_counted_not_logged_with_tracebacks(tmp_path):
    """Anyone who can connect can send garbage: it is answered 400, counted, every one of
    it, and costs the log nothing at the default level (it was an ERROR with a traceback per
    request). Garbage, binary and a TLS hello went uncounted: 285 of 500 were."""
    import socket

    from procs import http_get, start_exporter, wait_for

    proc, url = start_exporter(tmp_path, "--root", str(REPO / "tests" / "fixtures" / "nodes" / "roce-mlx5"))
    port = int(url.rsplit(":", 1)[1])
    garbage = [b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
               b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
               b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
               b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
               b"hello, is anyone there?\r\n\r\n",
               bytes(range(256)),
               tls_client_hello()]
    before = proc.log_path.stat().st_size

    def counted() -> float:
        body = http_get(url + "/metrics")[2].decode()
        return next(float(l.split()[-1]) for l in body.splitlines()
                    if l.startswith("gpunet_exporter_http_bad_requests_total "))

    try:
        for i in range(500):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(garbage[i % len(garbage)])
                try:
                    while s.recv(65536):  # the 400, then the close
                        pass
                except ConnectionResetError:
                    pass
        wait_for(lambda: counted() >= 500, what="every bad request counted")  # with the next tick's body
        assert counted() == 500
        log = proc.log_path.read_bytes()[before:]
        assert b"Traceback" not in log and len(log) < 1000, log[:2000]
    finally:
        proc.stop()
