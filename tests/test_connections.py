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
    return refused_in(http_get(url + "/metrics")[2].decode(), reason)


def refused_in(body: str, reason: str) -> float:
    return next(s.value for f in text_string_to_metric_families(body) for s in f.samples
                if s.name == "gpunet_exporter_http_refused_total" and s.labels["reason"] == reason)


def accept_queue(port: int) -> int | None:
    """Connections waiting in the accept queue of the socket listening on 127.0.0.1:port (for
    a listening socket, /proc/net/tcp's rx_queue is that queue's length); None: no such socket."""
    local = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[3] == "0A":  # TCP_LISTEN
                return int(fields[4].split(":")[1], 16)
    return None


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
    wait_for(lambda: accept_queue(port) == 0, what="the server took the 4 connections")
    with socket.create_connection(("127.0.0.1", port)) as extra:
        assert closed_within(extra, 10) is not None  # held open, it would last the 30 s idle timeout
    for s in held[:2]:
        s.close()
    # Once the server saw two go, a scrape gets through (one turned away is an OSError, and
    # counted too); the count goes out with the next tick's body.
    wait_for(lambda: refused(url, "connection_limit") >= 1, what="connection_limit counted in a scrape")
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
    # The header timeout (2 s) cuts the flood; then a scrape gets through again (one turned
    # away at the cap is an OSError) and shows the connections it cut.
    status, _, body = wait_for(lambda: (r := http_get(url + "/metrics"))[0] == 200
                               and refused_in(r[2].decode(), "header_timeout") >= 40 and r,
                               timeout=30, what="a scrape after the header timeout cut the flood")
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
        # Each client is served (an 8 MB render) and cut in turn; under load the last ones may
        # start after the first are cut, so the buffers are watched until all 20 are gone.
        most_held, deadline = 0, time.monotonic() + 60
        while registry._refused["write_timeout"] < 20 and time.monotonic() < deadline:
            held = [w.transport.get_write_buffer_size() for w in connections._open.values() if w.transport]
            most_held = max([most_held, *held])
            await asyncio.sleep(0.05)
        assert registry._refused["write_timeout"] == 20
        assert 0 < most_held <= 2 * WRITE_CHUNK + 65536, most_held  # one chunk waiting, one in the transport
        assert len(connections) == 0
    finally:
        for s in clients:
            s.close()
        listener.close()
        await runner.cleanup()
