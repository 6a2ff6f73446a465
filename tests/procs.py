"""Start and stop the real processes tests need (exporter, Prometheus), on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except OSError as e:
            last_error = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


class Process:
    """A child process killed (by its own pid) when the test ends."""

    def __init__(self, args: list[str], log_path: Path, **kwargs):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, **kwargs)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 5.0) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode


def exporter_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "exporter", *args]


def start_exporter(tmp_path: Path, *args: str, port: int | None = None) -> tuple[Process, str]:
    port = port or free_port()
    proc = Process(exporter_command("--listen", f"127.0.0.1:{port}", *args), tmp_path / f"exporter-{port}.log",
                   cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(url + "/healthz")[0] == 200, what=f"exporter on {url}")
    except TimeoutError:
        proc.stop()
        raise AssertionError(f"exporter did not start:\n{proc.log()}") from None
    return proc, url


def start_prometheus(args: list[str], log_path: Path) -> tuple[Process, str]:
    """`prometheus ARGS --web.listen-address=<free loopback port>`, once it is ready."""
    port = free_port()
    proc = Process(["prometheus", *args, f"--web.listen-address=127.0.0.1:{port}"], log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(url + "/-/ready")[0] == 200, what="prometheus ready")
    except TimeoutError:
        proc.stop()
        raise AssertionError(f"prometheus did not start:\n{proc.log()}") from None
    return proc, url


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d: Path) -> Path:
    """In `d`: a CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    d.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=gpunet test CA",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"))
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
                "-out", str(d / f"{name}.csr"))
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
                "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.crt"))
    return d


def values(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of the exporter's /metrics: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    body = http_get(url + "/metrics")[2].decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples}


def up(v: dict, collector: str) -> float | None:
    """gpunet_exporter_collector_up of one collector in `values`' samples."""
    return v.get(("gpunet_exporter_collector_up", (("collector", collector),)))
