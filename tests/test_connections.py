"""Connection hygiene over real sockets: header, idle and write timeouts, the connection cap
(also under a low file limit) and floods of silent or half-sent connections beside a
scraper, and clients that never read holding one chunk, not a body."""

import asyncio
import os
import resource
import selectors
import socket
import threading
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


class Flood:
    """`count` connections that send `payload` (or nothing) and then wait, kept up from a
    thread of their own: whenever the server closes one, it connects again at once."""

    def __init__(self, port: int, count: int, payload: bytes = b""):
        self.port, self.payload = port, payload
        self.selector = selectors.DefaultSelector()
        self.reconnects = 0
        self._stop = threading.Event()
        for _ in range(count):
            self._connect()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()

    def _connect(self) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        self.selector.register(s, selectors.EVENT_WRITE)  # writable once connected

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, events in self.selector.select(0.1):
                s = key.fileobj
                if events & selectors.EVENT_WRITE and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    if self.payload:
                        s.send(self.payload)
                    self.selector.modify(s, selectors.EVENT_READ)
                    continue
                try:
                    if events & selectors.EVENT_READ and s.recv(4096):
                        continue  # something sent before the close: wait for the close
                except OSError:
                    pass
                self.selector.unregister(s)
                s.close()
                self.reconnects += 1
                self._connect()


def fresh_scrapes(url: str, count: int) -> list[int | str]:
    """`count` scrapes, each on a connection of its own: each one's status, or its error."""
    answers: list[int | str] = []
    for _ in range(count):
        try:
            answers.append(http_get(url + "/metrics")[0])
        except OSError as e:
            answers.append(type(e).__name__)
    return answers


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


def test_a_silent_connection_is_closed_at_the_header_timeout(exporter):
    """Not held for the idle timeout (it was: 60 s by default, against 10 s for a header)."""
    proc, url, port = exporter("--web.header-timeout", "1", "--web.idle-timeout", "30")
    with socket.create_connection(("127.0.0.1", port)) as silent:
        took = closed_within(silent, 5)
    assert took is not None and 0.8 < took < 2.0, took
    wait_for(lambda: refused(url, "header_timeout") >= 1, what="header_timeout counted in a scrape")


def test_at_the_cap_the_longest_waiting_connection_makes_room(exporter):
    """At the cap a new connection takes the place of the one that has waited longest without
    a request (before, the newcomer was closed, and a scraper's fresh connection with it)."""
    proc, url, port = exporter("--web.max-connections", "4", "--web.idle-timeout", "30")
    held = []
    for _ in range(4):
        held.append(socket.create_connection(("127.0.0.1", port)))
        wait_for(lambda: accept_queue(port) == 0, what="the server took the connection")
    with socket.create_connection(("127.0.0.1", port)) as extra:
        assert closed_within(held[0], 5) is not None  # the oldest goes
        assert closed_within(held[1], 0.5) is None and closed_within(extra, 0.5) is None
    for s in held:
        s.close()
    wait_for(lambda: refused(url, "connection_limit") >= 1, what="connection_limit counted in a scrape")


def test_a_silent_flood_past_the_cap_does_not_lock_scrapers_out(exporter):
    """Three connections that never send for every two the cap allows, each reconnecting as
    soon as it is closed: every scrape on a fresh connection is answered (with 300 against
    256, none was: connection reset)."""
    proc, url, port = exporter("--web.max-connections", "20")
    flood = Flood(port, 30)
    try:
        wait_for(lambda: flood.reconnects >= 10, what="the flood at the cap")
        answers = fresh_scrapes(url, 10)
    finally:
        flood.close()
    assert answers == [200] * 10, answers


def test_a_connection_flood_under_a_low_file_limit_starves_nothing(exporter):
    """The file limit at 100 and 150 half-sent connections, each sent again as soon as it is
    closed: the cap (half the limit) holds, scrapes on fresh connections are all answered
    while the flood goes on (21 of 65 were), the collectors keep their files, nothing floods
    the log."""
    proc, url, port = exporter("--web.header-timeout", "2", nofile=100)
    before = proc.log_path.stat().st_size
    flood = Flood(port, 150, HALF_SENT)
    try:
        wait_for(lambda: flood.reconnects >= 100, what="the flood at the cap")
        answers = fresh_scrapes(url, 20)
    finally:
        flood.close()
    assert answers == [200] * 20, answers
    status, _, body = http_get(url + "/metrics")
    assert status == 200
    ups = {s.labels["collector"]: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples
           if s.name == "gpunet_exporter_collector_up"}
    assert ups and all(v == 1.0 for v in ups.values()), ups
    log = proc.log_path.read_bytes()[before:]
    assert b"Too many open files" not in log and len(log) < 2000, log[:2000]
    wait_for(lambda: refused(url, "connection_limit") >= 100, what="the shed connections counted")


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


async def serve_in_process(app, limits: Limits, registry: Registry):
    from aiohttp import web

    connections = Connections(limits, registry)
    runner = web.AppRunner(app(connections), access_log=None)
    await runner.setup()
    port = free_port()
    listener = Listener("127.0.0.1", port, runner, connections)
    await listener.serve(None)
    return connections, runner, listener, port


async def connect_and_send(port: int, request: bytes, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.setblocking(False)
    await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port))
    s.send(request)
    return s


async def closed_soon(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes `s` within `seconds` (reading and dropping what it sends)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(seconds):
            while await loop.sock_recv(s, 65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def test_at_the_cap_with_every_connection_serving_the_newcomer_is_closed():
    """Only connections waiting on their client are shed: with every one answering a
    request, a connection past the cap is closed, and the requests are answered."""
    from aiohttp import web

    release = asyncio.Event()
    answering = []
    registry = Registry("test")

    def app(connections: Connections) -> web.Application:
        @web.middleware
        async def guard(request, handler):
            connections.request_started(request.transport)
            return await handler(request)

        async def slow(request):
            answering.append(request)
            await release.wait()
            return web.Response(text="done\n")

        application = web.Application(middlewares=[guard])
        application.router.add_get("/", slow)
        return application

    connections, runner, listener, port = await serve_in_process(app, Limits(max_connections=4), registry)
    clients = []
    try:
        clients = [await connect_and_send(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(4)]
        deadline = time.monotonic() + 10
        while len(answering) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        newcomer = await connect_and_send(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        clients.append(newcomer)
        assert await closed_soon(newcomer, 5)
        assert registry._refused["connection_limit"] == 1
        release.set()
        for s in clients[:4]:
            answer = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(s, 65536), 5)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    finally:
        for s in clients:
            s.close()
        listener.close()
        await runner.cleanup()


async def test_clients_that_do_not_take_their_answer_make_room_at_the_cap():
    """A connection whose client does not read its response is shed for a newcomer at the
    cap, so clients that never read cannot lock a scraper out for the write timeout."""
    registry = Registry("test")
    registry.publish("wire", [Sample(NIC_RECEIVE_BYTES, (f"eth{i:06d}-{'x' * 60}",), float(i)) for i in range(80_000)],
                     0.0, 0)
    limits = Limits(max_connections=4, write_timeout=30)
    connections, runner, listener, port = await serve_in_process(
        lambda c: make_app(registry, None, Access(limits=limits), c), limits, registry)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    clients = []
    try:
        clients = [await connect_and_send(port, request, rcvbuf=4096) for _ in range(4)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(
                w.transport.get_write_buffer_size() > 0 for w in connections._open.values() if w.transport) < 4:
            await asyncio.sleep(0.05)  # each holds a chunk its client does not take
        scraper = await connect_and_send(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        clients.append(scraper)
        answer = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(scraper, 65536), 10)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
        assert registry._refused["connection_limit"] == 1 and registry._refused["write_timeout"] == 0
    finally:
        for s in clients:
            s.close()
        listener.close()
        await runner.cleanup()
