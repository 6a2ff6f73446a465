"""Connection hygiene over real sockets: header, idle and write timeouts, the connection cap
(also under a low file limit), and clients that never read holding one chunk, not a body."""

import asyncio
import os
import resource
import socket
import time

import pytest
from conftest import FIXTURES
from procs import REPO, Process, exporter_command, free_port, http_get, wait_for
from prometheus_client.parser import text_string_to_metric_families

from exporter.connections import Connections, Limits, Listener
from exporter.registry import Registry
from exporter.samples import Sample
from exporter.server import WRITE_CHUNK, Access, make_app
from gpunet.contract import NIC_RECEIVE_BYTES

HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # no blank line: the header never ends


def refused(url: str, reason: str) -> float:
    body = http_get(url + "/metrics")[2].decode()
    return next(s.value for f in text_string_to_metric_families(body) for s in f.samples
                if s.name == "gpunet_exporter_http_refused_total" and s.labels["reason"] == reason)


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed the connection (reading what it sent), None if it did not."""
    sock.settimeout(0.1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except ConnectionError:
            return time.monotonic() - t0
    return None


@pytest.fixture
def exporter(tmp_path):
    procs = []

    def start(*flags: str, nofile: int | None = None) -> tuple[Process, str, int]:
        port = free_port()
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
        proc = Process(exporter_command("--root", str(FIXTURES / "roce-mlx5"), "--listen", f"127.0.0.1:{port}",
                                        *flags), tmp_path / f"exporter-{port}.log", cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=limit)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_get(url + "/healthz")[0] == 200, what="exporter")
        return proc, url, port

    yield start
    for p in procs:
        p.stop()


def test_a_request_that_never_ends_its_header_is_cut(exporter):
    proc, url, port = exporter("--web.header-timeout", "1")
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(HALF_SENT)
        took = closed_within(s, 5)
    assert took is not None and 0.8 < took < 2.0, took
    assert refused(url, "header_timeout") == 1
    # A request that trickles in slower than the limit allows is cut too, even though bytes keep coming.
    with socket.create_connection(("127.0.0.1", port)) as s:
        t0 = time.monotonic()
        try:
            for byte in HALF_SENT:
                s.sendall(bytes([byte]))
                time.sleep(0.1)
        except ConnectionError:
            pass
        assert closed_within(s, 5) is not None and time.monotonic() - t0 < 2.5


def test_idle_connections_are_closed(exporter):
    proc, url, port = exporter("--web.idle-timeout", "1")
    with socket.create_connection(("127.0.0.1", port)) as silent:
        took = closed_within(silent, 5)
    assert took is not None and took < 2.0, took
    with socket.create_connection(("127.0.0.1", port)) as kept:  # keep-alive after one answer
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        took = closed_within(kept, 5)
    assert took is not None and took < 2.0, took


def test_connections_past_the_cap_are_closed_and_counted(exporter):
    proc, url, port = exporter("--web.max-connections", "4", "--web.idle-timeout", "30")
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", port)) as extra:
        assert closed_within(extra, 2) is not None
    for s in held[:2]:
        s.close()
    time.sleep(0.2)
    assert refused(url, "connection_limit") >= 1
    for s in held[2:]:
        s.close()


def test_a_connection_flood_under_a_low_file_limit_starves_nothing(exporter):
    """The file limit at 100 and 150 half-sent connections: the cap (half the limit) turns the
    rest away, the collectors keep their files, nothing floods the log, and scrapes work again
    once the header timeout has cut the flood."""
    proc, url, port = exporter("--web.header-timeout", "2", nofile=100)
    before = proc.log_path.stat().st_size
    flood = []
    for _ in range(150):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
            s.sendall(HALF_SENT)
            flood.append(s)
        except OSError:
            pass
    time.sleep(3.0)
    status, _, body = http_get(url + "/metrics")
    for s in flood:
        s.close()
    assert status == 200
    text = body.decode()
    ups = {s.labels["collector"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
           if s.name == "gpunet_exporter_collector_up"}
    assert ups and all(v == 1.0 for v in ups.values()), ups
    log = proc.log_path.read_bytes()[before:]
    assert b"Too many open files" not in log and len(log) < 2000, log[:2000]
    assert refused(url, "connection_limit") >= 1 and refused(url, "header_timeout") >= 40


async def test_clients_that_never_read_hold_one_chunk_and_are_cut():
    """An 8 MB body and 20 clients that send a request and never read: the server holds at
    most a chunk or two per client (not the body), and cuts them at the write timeout."""
    registry = Registry("test")
    registry.publish("wire", [Sample(NIC_RECEIVE_BYTES, (f"eth{i:06d}-{'x' * 60}",), float(i)) for i in range(80_000)],
                     0.0, 0)
    body_size = len(registry.render(openmetrics=False))
    assert body_size > 8e6
    limits = Limits(max_connections=64, write_timeout=1.5)
    connections = Connections(limits, registry)
    from aiohttp import web

    runner = web.AppRunner(make_app(registry, None, Access(limits=limits), connections), access_log=None)
    await runner.setup()
    port = free_port()
    listener = Listener("127.0.0.1", port, runner, connections)
    await listener.serve(None)
    clients = []
    try:
        for _ in range(20):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port))
            s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            clients.append(s)
        await asyncio.sleep(1.0)
        held = [w.transport.get_write_buffer_size() for w in connections._open.values() if w.transport]
        assert len(held) == 20
        assert max(held) <= 2 * WRITE_CHUNK + 65536, held  # one chunk waiting, one in the transport
        await asyncio.sleep(1.5)
        assert len(connections) == 0
        assert registry._refused["write_timeout"] == 20
    finally:
        for s in clients:
            s.close()
        listener.close()
        await runner.cleanup()
