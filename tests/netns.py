"""Helpers for live-network tests: network namespaces, a veth pair, iperf3, the exporter.

Everything here drives real tools (ip, tc, nft, iperf3, curl, nstat) and the real
exporter process; nothing is mocked. Every namespace is named after the test process's
pid (``gpn<pid>...``) so parallel runs never clash, and every process started inside a
namespace is ended by its pid (those ``ip netns pids`` lists) before the namespace is
deleted, even when a test fails half-way.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REQUIRED_TOOLS = ("ip", "ss", "tc", "iperf3", "nft", "curl", "nstat")

ADDR_A = "198.18.0.1"  # RFC 2544 benchmark range: never routed anywhere real
ADDR_B = "198.18.0.2"
PREFIX = 30

_seq = itertools.count()


def why_not_runnable() -> str | None:
    """The reason these tests cannot run here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "live network tests need Linux network namespaces"
    if os.geteuid() != 0:
        return "live network tests need root (network namespaces, tc, nft)"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        return "live network tests need these tools on PATH: " + ", ".join(missing)
    return None


def run(cmd: list[str], *, check: bool = True, timeout: float = 30, input: str | None = None,
        ) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it has ended, it only waits to be reaped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_pids(pids: list[int], grace: float = 2.0) -> None:
    """SIGTERM each pid, then SIGKILL those still running after `grace` seconds."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Netns:
    """One network namespace, named gpn<pid>_<seq><suffix> (unique per process and per call)."""

    def __init__(self, suffix: str):
        self.name = f"gpn{os.getpid()}_{next(_seq)}{suffix}"
        self._procs: list[subprocess.Popen] = []
        run(["ip", "netns", "add", self.name])
        try:
            self.run(["ip", "link", "set", "lo", "up"])
        except Exception:
            self.delete()
            raise

    def cmd(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return run(self.cmd(cmd), **kw)

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        # `ip netns exec` execs the command, so the Popen pid is the command's own pid.
        proc = subprocess.Popen(self.cmd(cmd), **kw)
        self._procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        proc = run(["ip", "netns", "pids", self.name], check=False)
        return [int(p) for p in proc.stdout.split() if p.isdigit()]

    def delete(self) -> None:
        """Kill every process inside (by pid), reap our children, delete the namespace."""
        for _ in range(3):  # a process could fork while we kill; look again
            pids = [p for p in self.pids() if p != os.getpid()]
            if not pids:
                break
            kill_pids(pids)
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        run(["ip", "netns", "del", self.name], check=False)

    def read_int(self, path: str) -> int:
        return int(self.run(["cat", path]).stdout.strip())

    def free_port(self) -> int:
        code = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
        return int(self.run([sys.executable, "-c", code]).stdout.strip())

    def nstat(self, counter: str) -> int:
        """Absolute value of a kernel SNMP counter in this namespace; -a: ignore history,
        -s: do not write a history file, -z: print it even when zero."""
        out = self.run(["nstat", "-asz", counter]).stdout
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0] == counter:
                return int(parts[1])
        raise RuntimeError(f"nstat printed no {counter}: {out!r}")


@dataclass
class Lab:
    """Namespaces A and B joined by a veth pair (gva in A, gvb in B), A's egress shaped."""

    a: Netns
    b: Netns
    rate_mbit: int
    dev_a: str = "gva"
    dev_b: str = "gvb"
    cleanups: list = field(default_factory=list)

    def tx_bytes(self) -> int:
        return self.a.read_int(f"/sys/class/net/{self.dev_a}/statistics/tx_bytes")

    def close(self) -> None:
        errors = []
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - clean up the rest, then report
                errors.append(e)
        for ns in (self.b, self.a):
            try:
                ns.delete()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if errors:
            raise errors[0]


def make_lab(rate_mbit: int = 200) -> Lab:
    a = Netns("a")
    try:
        b = Netns("b")
    except Exception:
        a.delete()
        raise
    lab = Lab(a, b, rate_mbit)
    try:
        # Created straight into the namespaces: nothing appears in the caller's namespace.
        run(["ip", "link", "add", lab.dev_a, "netns", a.name, "type", "veth",
             "peer", "name", lab.dev_b, "netns", b.name])
        a.run(["ip", "addr", "add", f"{ADDR_A}/{PREFIX}", "dev", lab.dev_a])
        b.run(["ip", "addr", "add", f"{ADDR_B}/{PREFIX}", "dev", lab.dev_b])
        a.run(["ip", "link", "set", lab.dev_a, "up"])
        b.run(["ip", "link", "set", lab.dev_b, "up"])
        # Token bucket on A's egress (this kernel has no netem).
        # burst 256kb: at 200 Mbit/s that is ~10 ms of tokens, far above the minimum
        #   (rate/HZ, ~100 KB at HZ=250) and above a 64 KB GSO super-packet, so tbf never has
        #   to split GSO packets and the timer granularity never starves the bucket;
        # latency 50ms: queue limit = rate*latency + burst ~ 1.5 MB, enough for TCP's window
        #   to keep the bucket busy without tail drops (TCP measured ~195 Mbit/s of goodput
        #   with 0 retransmits), and small enough that the queue drains within one fast tick
        #   or so after the sender stops, so saturated time ends with the traffic.
        a.run(["tc", "qdisc", "add", "dev", lab.dev_a, "root", "tbf", "rate", f"{rate_mbit}mbit",
               "burst", "256kb", "latency", "50ms"])
    except Exception:
        lab.close()
        raise
    return lab


# --- iperf3 ---------------------------------------------------------------------------
def wait_listening(ns: Netns, port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = ns.run(["ss", "-Htln", f"sport = :{port}"], check=False).stdout
        if out.strip():
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} in {ns.name} after {timeout}s")


def iperf3(client: Netns, server: Netns, server_addr: str, seconds: float, port: int = 5201) -> dict:
    """One TCP test from `client` to a one-shot server in `server`; returns iperf3's JSON."""
    srv = server.popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    try:
        wait_listening(server, port)
        proc = client.run(["iperf3", "-c", server_addr, "-p", str(port), "-t", str(seconds), "-J"],
                          check=False, timeout=seconds + 20)
        try:
            result = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise RuntimeError(f"iperf3 printed no JSON (rc {proc.returncode}): {proc.stderr[-500:]}") from None
        if "error" in result or proc.returncode != 0:
            raise RuntimeError(f"iperf3 failed (rc {proc.returncode}): {result.get('error')}")
        return result
    finally:
        try:
            srv.wait(timeout=3)  # -1: it exits after the one test
        except subprocess.TimeoutExpired:
            kill_pids([srv.pid])
            srv.wait(timeout=5)


# --- the exporter -------------------------------------------------------------------------
def exporter_command() -> list[str]:
    script = Path(sys.executable).with_name("gpunet-exporter")
    if script.exists():
        return [str(script)]
    found = shutil.which("gpunet-exporter")
    return [found] if found else [sys.executable, "-m", "exporter"]


class Scrape:
    """A parsed /metrics body: {(sample name, frozenset(labels)): value}."""

    def __init__(self, status: int, text: str):
        self.status = status
        self.text = text
        self.samples: dict[tuple[str, frozenset], float] = {}
        if status == 200:
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def value(self, name: str, **labels: str) -> float:
        v = self.get(name, **labels)
        if v is None:
            raise AssertionError(f"no series {name}{labels} in the scrape")
        return v

    def has(self, name: str) -> bool:
        return any(k[0] == name for k in self.samples)

    def with_label(self, key: str, value: str) -> list[str]:
        return sorted(f"{n}{dict(l)}" for n, l in self.samples if (key, value) in l)


class Exporter:
    """gpunet-exporter running inside a namespace, scraped with curl from inside it."""

    def __init__(self, ns: Netns, args: list[str], log_path: Path):
        self.ns = ns
        self.port = ns.free_port()
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = ns.popen([*exporter_command(), "--listen", f"127.0.0.1:{self.port}", *args],
                             stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def get(self, path: str) -> tuple[int, str]:
        proc = self.ns.run(["curl", "-sS", "--max-time", "5", "-w", "\n%{http_code}", self.url + path],
                           check=False, timeout=10)
        body, _, code = proc.stdout.rpartition("\n")
        return (int(code) if code.isdigit() else 0), body

    def scrape(self) -> Scrape:
        return Scrape(*self.get("/metrics"))

    def wait_healthy(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exporter exited {self.proc.returncode}:\n{self.log()}")
            if self.get("/healthz")[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"exporter not healthy after {timeout}s:\n{self.log()}")

    def wait_for(self, predicate, timeout: float = 5.0, what: str = "condition") -> Scrape:
        deadline = time.monotonic() + timeout
        while True:
            scrape = self.scrape()
            if scrape.status == 200 and predicate(scrape):
                return scrape
            if time.monotonic() > deadline:
                raise AssertionError(f"exporter: no {what} after {timeout}s; last status {scrape.status}")
            time.sleep(0.1)

    def wait_ticks(self, fast: int = 0, slow: int = 0, timeout: float = 30.0) -> Scrape:
        """A scrape once `fast` fast ticks and `slow` slow ticks have begun after this call and
        ended: the exporter's own count (gpunet_exporter_ticks_total), not wall time, so a
        loaded machine waits longer rather than seeing fewer ticks. A tick is counted as it
        begins, and a body is rendered again only at a tick's publish, so the count in a
        scrape now may leave out one tick already begun: n + 2 past it means n whole ticks
        that began after this call (a fast tick's interval reaches back to the tick before it,
        so of n fast ticks, n - 1 are wholly after this call)."""
        def count(scrape: Scrape, tick: str) -> float:
            return scrape.get("gpunet_exporter_ticks_total", tick=tick) or 0.0

        mark = self.wait_for(lambda s: True, what="a scrape")
        want = {tick: count(mark, tick) + n + 2 for tick, n in (("fast", fast), ("slow", slow)) if n}
        return self.wait_for(lambda s: all(count(s, tick) >= n for tick, n in want.items()), timeout=timeout,
                             what=f"{fast} fast and {slow} slow ticks")

    def stop(self) -> None:
        if self.proc.poll() is None:
            kill_pids([self.proc.pid])
        try:
            self.proc.wait(timeout=5)
        finally:
            self._log.close()
