"""Signals at the moments they really come: a config reloader's SIGHUP as soon as the port
accepts, and before it is bound; a reload's effect on kept-alive connections. Real
exporter processes, real signals, real sockets."""

import os
import signal
import socket
import time
from pathlib import Path

import bcrypt
import pytest
from conftest import FIXTURES
from procs import REPO, Process, exporter_command, free_port, http_get, wait_for

# Bits of /proc/PID/status SigCgt: the signals the process has a handler for.
CAUGHT = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM}
FETCH = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"  # the index: 200 from the start


def caught_signals(pid: int) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    return set()


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def web_config(tmp_path) -> Path:
    path = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"right-horse", bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return path


@pytest.fixture
def start(tmp_path):
    procs = []

    def start(*flags: str) -> tuple[Process, int]:
        port = free_port()
        proc = Process(exporter_command("--root", str(FIXTURES / "roce-mlx5"), "--listen", f"127.0.0.1:{port}",
                                        *flags), tmp_path / f"exporter-{port}.log", cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
        procs.append(proc)
        return proc, port

    yield start
    for p in procs:
        p.stop()


def test_a_sighup_as_soon_as_the_port_accepts_is_never_fatal(start, web_config):
    """A config reloader's SIGHUP the moment the port accepts, 15 times: 11 of 15 exporters
    died by it (silently: the handler came after the listener and the sampler)."""
    for attempt in range(15):
        proc, port = start(f"--web.config.file={web_config}")
        wait_for(lambda: accepts(port), interval=0.001, what="the port accepting")
        proc.popen.send_signal(signal.SIGHUP)
        # The reload (or the note that it comes once serving) is logged; then it serves on.
        wait_for(lambda: "reloaded" in proc.log() or not proc.alive(), what="the SIGHUP handled")
        assert proc.alive(), f"attempt {attempt}: died by {proc.popen.returncode}\n{proc.log()}"
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] in (200, 401, 503)
        assert "Traceback" not in proc.log()
        proc.stop()


def test_the_handlers_are_in_place_before_the_port_is_bound(start, web_config):
    """SIGHUP, SIGTERM and SIGINT are caught at a moment the port does not accept yet; a
    SIGHUP then (before the config is loaded or while it is) is logged and the exporter
    serves on."""
    proc, port = start(f"--web.config.file={web_config}")

    def caught_before_bound() -> bool | None:
        if not caught_signals(proc.pid) >= CAUGHT:
            assert not accepts(port), "the port accepted before the signal handlers were in place"
            return None
        # Caught at the read above; not bound yet now, so not bound then either.
        return not accepts(port) or pytest.fail("the handlers came only after the port was bound")

    wait_for(caught_before_bound, interval=0.0005, what="the signal handlers")
    proc.popen.send_signal(signal.SIGHUP)
    wait_for(lambda: accepts(port) or not proc.alive(), what="the port accepting")
    assert proc.alive(), proc.log()
    # Applied: the loop takes the signal once serving (or notes it while starting and
    # reloads once serving).
    wait_for(lambda: "reloaded" in proc.log(), what="the SIGHUP applied")
    assert proc.alive() and "Traceback" not in proc.log()


def aiohttp_loaded(pid: int) -> bool:
    return "/aiohttp/" in Path(f"/proc/{pid}/maps").read_text()


def test_a_sighup_during_the_imports_is_noted_not_fatal(start, web_config):
    """Earlier still: a SIGHUP while the exporter imports its server (exporter/__main__.py
    catches it as soon as its settings are read, before aiohttp loads)."""
    proc, port = start(f"--web.config.file={web_config}")

    def caught_before_aiohttp() -> bool:
        if signal.SIGHUP not in caught_signals(proc.pid):
            return False
        # Caught at the read above; aiohttp not loaded now, so not loaded then either.
        return not aiohttp_loaded(proc.pid) or pytest.fail("SIGHUP was caught only once the server was imported")

    wait_for(caught_before_aiohttp, interval=0.0005, what="SIGHUP caught")
    proc.popen.send_signal(signal.SIGHUP)
    wait_for(lambda: accepts(port) or not proc.alive(), what="the port accepting")
    assert proc.alive(), proc.log()
    wait_for(lambda: "SIGHUP while starting" in proc.log(), what="the SIGHUP logged")


def test_sigterm_while_starting_stops_cleanly(start, web_config):
    proc, port = start(f"--web.config.file={web_config}")
    wait_for(lambda: signal.SIGTERM in caught_signals(proc.pid), interval=0.0005, what="SIGTERM caught")
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(10) == 0, proc.log()


def closed_by_server(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes this connection within `seconds` (reading what it sends)."""
    sock.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if sock.recv(65536) == b"":
                return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return False


def read_answer(sock: socket.socket) -> bytes:
    """All the server sends until it closes the connection."""
    sock.settimeout(5)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_reload_closes_idle_kept_alive_connections_at_once(start, tmp_path):
    """After a SIGHUP the next request on an idle kept-alive connection got no answer, and
    the connection was held until the header timeout (Prometheus's default scrape timeout).
    Now: closed at once (the scraper reconnects); a request under way is answered with
    "Connection: close"; a connection that never sent is closed too."""
    config = tmp_path / "web.yml"
    config.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    proc, port = start(f"--web.config.file={config}", "--web.idle-timeout", "60")
    wait_for(lambda: accepts(port), what="the port accepting")
    kept = socket.create_connection(("127.0.0.1", port))
    kept.sendall(FETCH)
    kept.settimeout(5)
    assert kept.recv(65536).startswith(b"HTTP/1.1 ")  # answered, kept alive
    silent = socket.create_connection(("127.0.0.1", port))
    halfway = socket.create_connection(("127.0.0.1", port))
    halfway.sendall(FETCH[:20])
    # A request on a connection opened after them is answered: the server has taken both,
    # and the first bytes of the half-sent one.
    assert http_get(f"http://127.0.0.1:{port}/")[0] == 200

    proc.popen.send_signal(signal.SIGHUP)
    wait_for(lambda: "reloaded" in proc.log(), what="the reload")
    assert closed_by_server(kept, 2.0), "an idle kept-alive connection was left open after the reload"
    assert closed_by_server(silent, 2.0), "a silent connection was left open after the reload"
    halfway.sendall(FETCH[20:])
    answer = read_answer(halfway)  # the answer, then the close
    assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer, answer[:300]
    for s in (kept, silent, halfway):
        s.close()
    assert http_get(f"http://127.0.0.1:{port}/healthz")[0] in (200, 503)  # a new connection is served
