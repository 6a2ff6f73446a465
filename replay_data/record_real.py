#!/usr/bin/env python3
"""Record real, labelled gpunet traces from real kernel counters (issue 4, "Real traces").

    python replay_data/record_real.py OUTDIR [--traces real-bandwidth,real-loss,real-iperf3]

Needs root, Linux network namespaces, iproute2 (ip, tc with tbf; no netem needed),
nftables, iperf3, curl, nstat, prometheus, and for the training job torch (CPU build) with
gloo. Everything it starts is ended by pid, and every namespace it makes is deleted, in
finally blocks, also on Ctrl-C or SIGTERM; a namespace left by a run that was killed
with SIGKILL (``gpnrec<pid>?`` whose pid is gone) is removed at the next start.

Topology (made anew for every trace, so per-namespace kernel counters start quiet):

    gpnrec<pid>a (node-a)  fab0 198.18.0.1/30 <== data veth ==> fab0 198.18.0.2/30  gpnrec<pid>b (node-b)
                           mgmt0 198.19.0.1/30                  mgmt0 198.19.0.5/30
                                 |  management veths                  |
                           mgta 198.19.0.2/30  gpnrec<pid>m (mgmt)  mgtb 198.19.0.6/30

Only addresses in 198.18.0.0/15 (RFC 2544 benchmark range, never routed) and loopback
inside these namespaces carry traffic. node-a and node-b each run gpunet-exporter on
0.0.0.0:9845 (``--fabric-devices fab0 --link-speed fab0=<shaped rate>``, and
``--gpu-fixture`` where the job runs); mgmt runs a real Prometheus that scrapes both over
the management veths every 5 s (instance relabelled to node-a:9845 / node-b:9845, job
gpunet). fab0 is shaped with tbf on both ends (both directions).

The training job is a two-process torch.distributed gloo job, rank 0 in node-a and rank 1
in node-b, rendezvous tcp://198.18.0.1:29500 over fab0 (GLOO_SOCKET_IFNAME=fab0). Each step
is a compute phase (a sleep of ~0.8 s standing in for the GPU's forward/backward: a CPU
matmul would fight the exporters for this machine's two cores) then an all_reduce of the
gradient. Each rank writes its node's nvml.json (two H100-like GPUs) atomically, with
utilization_gpu 100 during compute and 0 while it waits in the collectives, so the
exporter's GPU idle split by network_state follows the real network.

Traces (each: --lead s healthy, --incident s of the fault, --tail s healthy):
  real-bandwidth  fab0 at 200 Mbit/s; the gradient grows from 1 MB to 25 MB per step for the
                  incident: the link is the bottleneck (network_bandwidth, both nodes).
  real-loss       fab0 at 1 Gbit/s, 8 MB per step, TCP SACK off in the node namespaces; nftables
                  on node-b drops 3% of what arrives from node-a (packet_loss, node-b). Without
                  SACK, recovery is go-back-N-like and the all-reduce throughput collapses.
  real-iperf3     no job, exporters with --no-gpu; one iperf3 stream fills the 200 Mbit/s link
                  (network_bandwidth, GPU impact unknown: no GPU series).
  real-loss-sack  as real-loss with Linux's default TCP (SACK, RACK-TLP): retransmits rise
                  just as clearly but the job hardly slows on a ~50 us RTT.

After each run the recorded window is exported with ``gpunet-trace export`` (run inside the
mgmt namespace) into OUTDIR/NAME.om.gz, the ground truth is written to NAME.labels.json
(docs/trace-format.md), the trace is loaded back with ``gpunet-trace load`` as a check, and
a short summary computed from the trace itself is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from diagnoser.frame import counter_increase
from diagnoser.sources import replay

# --- addresses and names --------------------------------------------------------------------
FAB_A, FAB_B, FAB_PREFIX = "198.18.0.1", "198.18.0.2", 30
MGMT_A, MGMT_MA = "198.19.0.1", "198.19.0.2"  # node-a's mgmt0 <-> mgmt's mgta
MGMT_B, MGMT_MB = "198.19.0.5", "198.19.0.6"  # node-b's mgmt0 <-> mgmt's mgtb
MGMT_PREFIX = 30
EXPORTER_PORT = 9845
PROM_LISTEN = "127.0.0.1:9090"  # inside the mgmt namespace
RDZV_PORT = 29500
IPERF_PORT = 5201
SCRAPE_INTERVAL = 5
NODE_A, NODE_B = "node-a:9845", "node-b:9845"
NS_PREFIX = "gpnrec"
STALE_NS = re.compile(rf"^{NS_PREFIX}(\d+)[abm]$")
NFT_TABLE = "gpnrec_loss"
GIB = 1 << 30

TOOLS = ("ip", "tc", "nft", "iperf3", "curl", "nstat", "ss", "sysctl", "prometheus", "promtool")


# --- small process helpers --------------------------------------------------------------------
def sh(cmd: list[str], *, check: bool = True, timeout: float = 60, input: str | None = None,
       ) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie answers kill(0) but has ended
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM each pid, then SIGKILL what still runs after `grace` seconds."""
    pids = [p for p in pids if p != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def tool(name: str) -> str:
    """A console script of this Python's environment, else from PATH."""
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found")
    return found


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- namespaces ---------------------------------------------------------------------------------
class Netns:
    def __init__(self, name: str):
        self.name = name
        self.procs: list[subprocess.Popen] = []
        sh(["ip", "netns", "add", name])
        self.created = True
        self.run(["ip", "link", "set", "lo", "up"])

    def cmd(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return sh(self.cmd(cmd), **kw)

    def popen(self, cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
        # `ip netns exec` execs the command: the Popen pid is the command's own pid. A new
        # session keeps a terminal's Ctrl-C from reaching it: we end it ourselves, in order.
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(self.cmd(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        proc = sh(["ip", "netns", "pids", self.name], check=False)
        return [int(p) for p in proc.stdout.split() if p.isdigit()]

    def nstat(self, counter: str) -> int:
        out = self.run(["nstat", "-asz", counter]).stdout
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0] == counter:
                return int(parts[1])
        raise RuntimeError(f"nstat printed no {counter}")

    def delete(self) -> None:
        for proc in self.procs:  # ours first, by pid, politely
            if proc.poll() is None:
                kill_pids([proc.pid])
        for _ in range(3):  # then anything else still inside (a fork of ours)
            pids = self.pids()
            if not pids:
                break
            kill_pids(pids)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        sh(["ip", "netns", "del", self.name], check=False)


def remove_stale_namespaces() -> None:
    """Namespaces of an earlier run of this script that was killed before it could clean up."""
    out = sh(["ip", "netns", "list"], check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = STALE_NS.match(name)
        if m and int(m.group(1)) != os.getpid() and not alive(int(m.group(1))):
            log(f"removing stale namespace {name} (its recorder, pid {m.group(1)}, is gone)")
            pids = [int(p) for p in sh(["ip", "netns", "pids", name], check=False).stdout.split() if p.isdigit()]
            kill_pids(pids)
            sh(["ip", "netns", "del", name], check=False)


def tbf(ns: Netns, dev: str, rate_mbit: int) -> None:
    # Token bucket on egress (this kernel has no netem). burst: ~10 ms of tokens and at least
    # 256 KB (above rate/HZ and a 64 KB GSO packet); latency 50 ms: queue ~ rate*50ms + burst,
    # enough for TCP to keep the bucket busy, small enough to drain within a fast tick or so.
    burst_kb = max(256, int(rate_mbit * 1e6 / 8 / 100 / 1024))
    ns.run(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
            "burst", f"{burst_kb}kb", "latency", "50ms"])


@dataclass
class Lab:
    """Three namespaces, the veths, tbf on fab0, and the processes inside them."""

    rate_mbit: int
    work: Path
    a: Netns | None = None
    b: Netns | None = None
    m: Netns | None = None
    exporters: dict = field(default_factory=dict)

    def build(self) -> None:
        base = f"{NS_PREFIX}{os.getpid()}"
        self.a = Netns(base + "a")
        self.b = Netns(base + "b")
        self.m = Netns(base + "m")
        a, b, m = self.a.name, self.b.name, self.m.name
        # Made straight inside the namespaces: nothing appears in the caller's namespace.
        sh(["ip", "link", "add", "fab0", "netns", a, "type", "veth", "peer", "name", "fab0", "netns", b])
        sh(["ip", "link", "add", "mgmt0", "netns", a, "type", "veth", "peer", "name", "mgta", "netns", m])
        sh(["ip", "link", "add", "mgmt0", "netns", b, "type", "veth", "peer", "name", "mgtb", "netns", m])
        for ns, dev, addr, prefix in ((self.a, "fab0", FAB_A, FAB_PREFIX), (self.b, "fab0", FAB_B, FAB_PREFIX),
                                      (self.a, "mgmt0", MGMT_A, MGMT_PREFIX), (self.b, "mgmt0", MGMT_B, MGMT_PREFIX),
                                      (self.m, "mgta", MGMT_MA, MGMT_PREFIX), (self.m, "mgtb", MGMT_MB, MGMT_PREFIX)):
            ns.run(["ip", "addr", "add", f"{addr}/{prefix}", "dev", dev])
            ns.run(["ip", "link", "set", dev, "up"])
        tbf(self.a, "fab0", self.rate_mbit)
        tbf(self.b, "fab0", self.rate_mbit)

    def close(self) -> None:
        errors = []
        for ns in (self.a, self.b, self.m):
            if ns is None:
                continue
            try:
                ns.delete()
            except Exception as e:  # noqa: BLE001 - clean up the rest, then report
                errors.append(e)
        if errors:
            raise errors[0]

    # -- the services --
    def start_prometheus(self) -> None:
        config = {
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL}s", "scrape_timeout": "4s",
                       "evaluation_interval": "1m"},
            "scrape_configs": [{
                "job_name": "gpunet",
                "static_configs": [{"targets": [f"{MGMT_A}:{EXPORTER_PORT}", f"{MGMT_B}:{EXPORTER_PORT}"]}],
                "relabel_configs": [
                    {"source_labels": ["__address__"], "regex": re.escape(f"{MGMT_A}:{EXPORTER_PORT}"),
                     "target_label": "instance", "replacement": NODE_A},
                    {"source_labels": ["__address__"], "regex": re.escape(f"{MGMT_B}:{EXPORTER_PORT}"),
                     "target_label": "instance", "replacement": NODE_B},
                ]}]}
        cfg = self.work / "prometheus.yml"
        cfg.write_text(json.dumps(config, indent=1))  # JSON is YAML
        data = self.work / "prometheus-data"
        data.mkdir(exist_ok=True)
        self.m.popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}",
                      f"--web.listen-address={PROM_LISTEN}", "--storage.tsdb.retention.time=1d"],
                     self.work / "prometheus.log")
        self.wait_http(self.m, f"http://{PROM_LISTEN}/-/ready", "prometheus", self.work / "prometheus.log")

    def start_exporter(self, ns: Netns, node: str, args: list[str]) -> None:
        logp = self.work / f"exporter-{node}.log"
        ns.popen([tool("gpunet-exporter"), "--listen", f"0.0.0.0:{EXPORTER_PORT}", *args], logp)
        addr = MGMT_A if ns is self.a else MGMT_B
        # Checked from the mgmt namespace, as Prometheus will reach it.
        self.wait_http(self.m, f"http://{addr}:{EXPORTER_PORT}/healthz", f"exporter {node}", logp)

    def wait_http(self, ns: Netns, url: str, what: str, logp: Path, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = ns.run(["curl", "-fsS", "--max-time", "2", "-o", "/dev/null", url], check=False)
            if r.returncode == 0:
                return
            time.sleep(0.3)
        raise RuntimeError(f"{what} not answering {url} after {timeout}s:\n{logp.read_text(errors='replace')[-2000:]}")

    def prom_query(self, query: str) -> list:
        r = self.m.run(["curl", "-fsS", "--max-time", "5", "--get", "--data-urlencode", f"query={query}",
                        f"http://{PROM_LISTEN}/api/v1/query"], check=False)
        if r.returncode != 0:
            return []
        return json.loads(r.stdout).get("data", {}).get("result", [])

    def wait_scraped(self, timeout: float = 40) -> None:
        """Until Prometheus has scraped both exporters successfully, twice (rates exist)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = self.prom_query('count_over_time(up{job="gpunet"}[1m]) >= 2 and up{job="gpunet"} == 1')
            if {r["metric"].get("instance") for r in res} >= {NODE_A, NODE_B}:
                return
            time.sleep(1)
        raise RuntimeError(f"Prometheus did not scrape both exporters in {timeout}s: "
                           f"{self.prom_query('up')}")


# --- GPU fixture (nvml.json), shared by the recorder and the ranks --------------------------------
def nvml_doc(node: str, busy: bool) -> dict:
    gpus = []
    for i, bus in enumerate(("18", "2A")):
        gpus.append({
            "index": i, "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"gpnrec.{node}.gpu{i}")),
            "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{bus}:00.0", "numa_node": 0,
            "utilization_gpu": 100 if busy else 0, "sm_clock_hz": 1980000000, "clock_event_reasons": [],
            "power_w": 640.0 if busy else 115.0, "temperature_c": 61.0 if busy else 38.0,
            "memory_used_bytes": 71 * GIB, "memory_total_bytes": 85520809984,
        })
    return {"driver_version": "550.90.07", "gpus": gpus}


def write_nvml(path: Path, node: str, busy: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(nvml_doc(node, busy)))
    os.replace(tmp, path)  # atomic: the exporter never reads half a file


# --- the training job (one rank; run by this script inside a node namespace) ---------------------
def rank_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="record_real.py _rank")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--nvml", required=True)
    p.add_argument("--schedule", required=True, help="SECONDS:MB[,SECONDS:MB...]: phases of the job")
    p.add_argument("--compute", type=float, default=0.8, help="seconds of compute per step")
    args = p.parse_args(argv)
    phases = [(float(s), float(mb)) for s, mb in (x.split(":") for x in args.schedule.split(","))]
    nvml = Path(args.nvml)

    def emit(**kw) -> None:
        print(json.dumps({"t": time.time(), "rank": args.rank, **kw}), flush=True)

    import random

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    emit(event="init", torch=torch.__version__)
    dist.init_process_group("gloo", init_method=f"tcp://{FAB_A}:{RDZV_PORT}", rank=args.rank, world_size=2,
                            timeout=__import__("datetime").timedelta(seconds=300))
    grads = {mb: torch.empty(int(mb * 1e6) // 4, dtype=torch.float32) for _, mb in phases}
    ctl = torch.zeros(2, dtype=torch.float64)  # [phase index, stop]
    dist.barrier()
    t_start = time.time()
    bounds = list(itertools_accumulate([s for s, _ in phases]))
    emit(event="start", phases=phases)
    phase_seen = -1
    step = 0
    rng = random.Random(args.rank)
    try:
        while True:
            t0 = time.time()
            write_nvml(nvml, args.node, busy=True)
            time.sleep(args.compute * rng.uniform(0.97, 1.03))  # forward + backward on the "GPU"
            write_nvml(nvml, args.node, busy=False)
            t1 = time.time()
            if args.rank == 0:
                elapsed = time.time() - t_start
                idx = next((i for i, b in enumerate(bounds) if elapsed < b), len(phases))
                ctl[0], ctl[1] = min(idx, len(phases) - 1), float(idx >= len(phases))
            dist.broadcast(ctl, src=0)  # rank 0 decides the phase: both all-reduce the same size
            if ctl[1] >= 1:
                break
            idx = int(ctl[0])
            if idx != phase_seen:
                emit(event="phase", phase=idx, mb=phases[idx][1])
                phase_seen = idx
            grad = grads[phases[idx][1]]
            grad.fill_(1.0)
            dist.all_reduce(grad)
            t2 = time.time()
            emit(event="step", step=step, phase=idx, mb=phases[idx][1], compute=t1 - t0, comm=t2 - t1)
            step += 1
    finally:
        write_nvml(nvml, args.node, busy=False)
    emit(event="end", steps=step)
    dist.destroy_process_group()
    return 0


def itertools_accumulate(xs):
    total = 0.0
    for x in xs:
        total += x
        yield total


class Job:
    """The two ranks, started in node-a and node-b; reads rank 0's event log."""

    def __init__(self, lab: Lab, schedule: list[tuple[float, float]], compute: float):
        self.lab = lab
        self.sched = ",".join(f"{s:g}:{mb:g}" for s, mb in schedule)
        self.compute = compute
        self.logs = {0: lab.work / "rank0.log", 1: lab.work / "rank1.log"}
        self.procs: dict[int, subprocess.Popen] = {}
        self.nvml = {NODE_A: lab.work / "node-a" / "nvml.json", NODE_B: lab.work / "node-b" / "nvml.json"}

    def start(self) -> None:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="fab0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for rank, (ns, node) in enumerate(((self.lab.a, NODE_A), (self.lab.b, NODE_B))):
            self.procs[rank] = ns.popen(
                [sys.executable, str(Path(__file__).resolve()), "_rank", "--rank", str(rank), "--node", node,
                 "--nvml", str(self.nvml[node]), "--schedule", self.sched, "--compute", str(self.compute)],
                self.logs[rank], env=env)

    def events(self, rank: int = 0) -> list[dict]:
        out = []
        if self.logs[rank].exists():
            for line in self.logs[rank].read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
        return out

    def wait_event(self, pred, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events():
                if pred(e):
                    return e
            for rank, proc in self.procs.items():
                if proc.poll() is not None and proc.returncode != 0:
                    raise RuntimeError(f"rank {rank} exited {proc.returncode}:\n"
                                       f"{self.logs[rank].read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"training job: no such event in {timeout}s; rank 0 log:\n"
                           f"{self.logs[0].read_text(errors='replace')[-3000:]}")

    def step_stats(self) -> dict[int, dict]:
        by_phase: dict[int, list[dict]] = {}
        for e in self.events():
            if e.get("event") == "step":
                by_phase.setdefault(e["phase"], []).append(e)
        out = {}
        for ph, steps in sorted(by_phase.items()):
            comm = [s["comm"] for s in steps]
            total = [s["comm"] + s["compute"] for s in steps]
            out[ph] = {"steps": len(steps), "mb": steps[0]["mb"], "median_step_s": round(statistics.median(total), 3),
                       "median_comm_s": round(statistics.median(comm), 3), "max_comm_s": round(max(comm), 3),
                       "comm_fraction": round(sum(comm) / sum(total), 3),
                       "allreduce_goodput_mbit": round(steps[0]["mb"] * 8 / statistics.median(comm), 1)}
        return out


# --- scenarios --------------------------------------------------------------------------------------
@dataclass
class Result:
    start: float
    end: float
    incidents: list[dict]
    notes: str


def gpu_args(job: Job, node: str) -> list[str]:
    return [f"--gpu-fixture={job.nvml[node]}"]


def run_job_scenario(lab: Lab, cfg: argparse.Namespace, name: str) -> Result:
    lead, inc, tail = cfg.lead, cfg.incident, cfg.tail
    if name == "real-bandwidth":
        small, big = cfg.small_mb, cfg.grad_mb
        schedule = [(lead, small), (inc, big), (tail, small)]
    else:
        schedule = [(lead, cfg.loss_grad_mb), (inc, cfg.loss_grad_mb), (tail, cfg.loss_grad_mb)]
    schedule = [(s, mb) for s, mb in schedule if s > 0]
    job = Job(lab, schedule, cfg.compute)
    for node in (NODE_A, NODE_B):
        job.nvml[node].parent.mkdir(parents=True, exist_ok=True)
        write_nvml(job.nvml[node], node, busy=False)  # GPUs present and idle until the job starts
    rate = f"{lab.rate_mbit}Mbit"
    lab.start_prometheus()
    for ns, node in ((lab.a, NODE_A), (lab.b, NODE_B)):
        lab.start_exporter(ns, node.split(":")[0], ["--fabric-devices", "fab0", "--link-speed", f"fab0={rate}",
                                                    *gpu_args(job, node)])
    lab.wait_scraped()
    job.start()
    t_start = job.wait_event(lambda e: e.get("event") == "start", 120)["t"]
    log(f"{name}: job started (schedule {job.sched})")
    retrans = {}
    loss_on = loss_off = None
    dropped = None
    spec = SCENARIOS[name]
    if spec["loss"]:
        retrans["start"] = {n: ns.nstat("TcpRetransSegs") for n, ns in (("node-a", lab.a), ("node-b", lab.b))}
        job.wait_event(lambda e: e.get("event") == "phase" and e.get("phase") == 1, lead + 60)
        retrans["before"] = {n: ns.nstat("TcpRetransSegs") for n, ns in (("node-a", lab.a), ("node-b", lab.b))}
        lab.b.run(["nft", "-f", "-"], input=(
            f"table inet {NFT_TABLE} {{\n chain prerouting {{\n"
            f"  type filter hook prerouting priority -300; policy accept;\n"
            f"  iifname \"fab0\" ip saddr {FAB_A} numgen random mod 100 < {cfg.loss_pct} counter drop\n }}\n}}\n"))
        loss_on = time.time()
        log(f"{name}: {cfg.loss_pct}% loss on node-b's fab0 ingress (nftables prerouting)")
        if tail > 0:
            job.wait_event(lambda e: e.get("event") == "phase" and e.get("phase") == 2, inc + 120)
        else:
            job.wait_event(lambda e: e.get("event") == "end", inc + 120)
        out = lab.b.run(["nft", "list", "table", "inet", NFT_TABLE]).stdout
        m = re.search(r"counter packets (\d+) bytes (\d+)", out)
        dropped = (int(m.group(1)), int(m.group(2))) if m else None
        lab.b.run(["nft", "delete", "table", "inet", NFT_TABLE])
        loss_off = time.time()
        retrans["during"] = {n: ns.nstat("TcpRetransSegs") for n, ns in (("node-a", lab.a), ("node-b", lab.b))}
        log(f"{name}: loss removed; dropped {dropped}")
    t_end = job.wait_event(lambda e: e.get("event") == "end", sum(s for s, _ in schedule) + 300)["t"]
    for proc in job.procs.values():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    phase_t = {e["phase"]: e["t"] for e in job.events() if e.get("event") == "phase"}
    stats = job.step_stats()
    log(f"{name}: job ended; step stats by phase: {json.dumps(stats)}")
    versions = tool_versions()
    phase_names = {0: "lead-in", 1: "incident", 2: "tail"}
    stats_text = "; ".join(f"{phase_names.get(ph, ph)}: {s['steps']} steps of {s['mb']:g} MB, median step "
                           f"{s['median_step_s']} s, median all-reduce {s['median_comm_s']} s (max {s['max_comm_s']} s), "
                           f"communication {100 * s['comm_fraction']:.0f}% of the time, all-reduce goodput "
                           f"{s['allreduce_goodput_mbit']} Mbit/s" for ph, s in stats.items())
    topo = (f"Two node namespaces (node-a, node-b) joined by a data veth fab0 (198.18.0.1/30 - 198.18.0.2/30) "
            f"shaped with tbf to {lab.rate_mbit} Mbit/s on both ends (both directions), each also joined to a "
            f"mgmt namespace by a management veth (mgmt0, 198.19.0.0/30 and 198.19.0.4/30) where a real "
            f"Prometheus scraped both exporters every {SCRAPE_INTERVAL} s. gpunet-exporter on each node: "
            f"--fabric-devices fab0 --link-speed fab0={rate} --gpu-fixture <node's nvml.json>. ")
    jobtxt = (f"Training job: torch.distributed, gloo backend, 2 ranks (rank 0 on node-a, rank 1 on node-b), "
              f"rendezvous tcp://{FAB_A}:{RDZV_PORT} over fab0 (GLOO_SOCKET_IFNAME=fab0); each step = "
              f"~{cfg.compute:g} s compute (a sleep standing in for forward/backward; nvml.json utilization_gpu "
              f"100 on both GPUs of the node) then all_reduce of a float32 gradient (utilization_gpu 0 while "
              f"waiting). ")
    if name == "real-bandwidth":
        start_i, end_i = phase_t.get(1, t_start + lead), phase_t.get(2, t_end)
        incidents = [{"class": "network_bandwidth", "start": round(start_i, 3), "end": round(end_i, 3),
                      "nodes": [NODE_A, NODE_B]}]
        what = (f"Schedule: {lead:g} s with a {cfg.small_mb:g} MB gradient (most layers frozen: healthy, compute "
                f"bound), then {inc:g} s with a {cfg.grad_mb:g} MB gradient (full model: the {lab.rate_mbit} Mbit/s "
                f"link is the bottleneck, fab0 saturated in both directions on both nodes while the GPUs wait)"
                + (f", then {tail:g} s with {cfg.small_mb:g} MB again" if tail > 0 else "")
                + ". The incident is the full-gradient phase. No loss, no congestion signal (tbf queue holds "
                "~50 ms, TCP sees no drops). ")
    else:
        incidents = [{"class": "packet_loss", "start": round(loss_on, 3), "end": round(loss_off, 3),
                      "nodes": [NODE_B]}]
        ra = {n: retrans["during"][n] - retrans["before"][n] for n in retrans["before"]}
        rl = {n: retrans["before"][n] - retrans["start"][n] for n in retrans["before"]}
        if spec["sack"]:
            tcp = ("TCP: Linux defaults in both node namespaces (SACK, RACK-TLP, CUBIC): on a veth whose RTT is "
                   "tens of microseconds, fast recovery repairs most losses within a millisecond, so the job "
                   "slows only through the occasional retransmission timeout; compare real-loss, where SACK was "
                   "off. ")
        else:
            tcp = ("TCP: net.ipv4.tcp_sack=0 in both node namespaces (per-namespace sysctl) for the whole run. "
                   "With Linux's default SACK + RACK-TLP, a few % of random loss on a veth whose RTT is tens of "
                   "microseconds costs the job almost nothing (see real-loss-sack); without SACK, TCP repairs one "
                   "hole per round trip and falls back to retransmission timeouts, a go-back-N-like recovery like "
                   "RoCE's, so the all-reduce throughput collapses as the packet_loss class describes. ")
        what = (f"Gradient {cfg.loss_grad_mb:g} MB every step. After a {lead:g} s healthy lead-in, nftables on "
                f"node-b dropped {cfg.loss_pct}% of the packets arriving on fab0 from node-a (table inet, "
                f"prerouting hook priority -300, `iifname fab0 ip saddr {FAB_A} numgen random mod 100 < "
                f"{cfg.loss_pct} drop`) for {loss_off - loss_on:.0f} s"
                + (f", then removed for a {tail:g} s healthy tail" if tail > 0 else "")
                + f". Dropped: {dropped[0] if dropped else '?'} packets as nftables saw them (veth hands over GSO "
                f"aggregates of up to 64 KB, so one drop can take several TCP segments). "
                f"The drops hit node-a's data segments "
                f"(and node-a's ACKs of node-b's data), so it is node-a's TCP RetransSegs that rose: kernel "
                f"TcpRetransSegs increase during the loss window node-a +{ra['node-a']}, node-b +{ra['node-b']} "
                f"(lead-in: node-a +{rl['node-a']}, node-b +{rl['node-b']}). "
                f"`nodes` names node-b, the node whose ingress dropped the packets (the lossy link is "
                f"node-a -> node-b on fab0). No RDMA counters exist on veth: the loss shows only as TCP "
                f"retransmits. " + tcp)
    notes = (what + topo + jobtxt + f"Measured from the job's own log: {stats_text}. " + versions)
    return Result(t_start, t_end, incidents, notes)


def run_iperf3_scenario(lab: Lab, cfg: argparse.Namespace, name: str) -> Result:
    rate = f"{lab.rate_mbit}Mbit"
    lab.start_prometheus()
    for ns, node in ((lab.a, "node-a"), (lab.b, "node-b")):
        lab.start_exporter(ns, node, ["--fabric-devices", "fab0", "--link-speed", f"fab0={rate}", "--no-gpu"])
    lab.wait_scraped()
    t_start = time.time()
    log(f"{name}: quiet lead-in {cfg.lead:g} s")
    time.sleep(cfg.lead)
    lab.b.popen(["iperf3", "-s", "-1", "-p", str(IPERF_PORT)], lab.work / "iperf3-server.log")
    deadline = time.monotonic() + 10
    while not lab.b.run(["ss", "-Htln", f"sport = :{IPERF_PORT}"], check=False).stdout.strip():
        if time.monotonic() > deadline:
            raise RuntimeError("iperf3 server did not listen")
        time.sleep(0.05)
    log(f"{name}: iperf3 node-a -> node-b for {cfg.incident:g} s")
    i_start = time.time()
    r = lab.a.run(["iperf3", "-c", FAB_B, "-p", str(IPERF_PORT), "-t", f"{cfg.incident:g}", "-J"], check=False,
                  timeout=cfg.incident + 60)
    i_end = time.time()
    res = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
    if r.returncode != 0 or "error" in res:
        raise RuntimeError(f"iperf3 failed (rc {r.returncode}): {res.get('error') or r.stderr[-500:]}")
    sent = res["end"]["sum_sent"]
    log(f"{name}: iperf3 {sent['bits_per_second'] / 1e6:.1f} Mbit/s, {sent.get('retransmits')} retransmits; "
        f"quiet tail {cfg.tail:g} s")
    time.sleep(cfg.tail)
    t_end = time.time()
    incidents = [{"class": "network_bandwidth", "start": round(i_start, 3), "end": round(i_end, 3),
                  "nodes": [NODE_A, NODE_B]}]
    notes = (f"No training job and no GPU: both exporters ran with --no-gpu, so the trace has no GPU series "
             f"(GPU impact unknown). After a {cfg.lead:g} s quiet lead-in, one iperf3 TCP stream node-a -> node-b "
             f"over fab0 for {cfg.incident:g} s: {sent['bits_per_second'] / 1e6:.1f} Mbit/s, "
             f"{sent.get('retransmits')} retransmits, saturating the tbf-shaped link (node-a transmit, node-b "
             f"receive), then a {cfg.tail:g} s quiet tail. Two node namespaces joined by a data veth fab0 "
             f"(198.18.0.1/30 - 198.18.0.2/30) shaped with tbf to {lab.rate_mbit} Mbit/s on both ends, each joined "
             f"to a mgmt namespace by a management veth where a real Prometheus scraped both exporters every "
             f"{SCRAPE_INTERVAL} s. gpunet-exporter on each node: --fabric-devices fab0 --link-speed fab0={rate} "
             f"--no-gpu. " + tool_versions())
    return Result(t_start, t_end, incidents, notes)


def tool_versions() -> str:
    def first(cmd):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            return (r.stdout or r.stderr).strip().splitlines()[0]
        except Exception:  # noqa: BLE001
            return "?"
    try:
        import torch
        tv = torch.__version__
    except ImportError:
        tv = "not installed"
    return (f"Versions: kernel {platform.release()}; {first(['iperf3', '--version'])}; "
            f"{first(['prometheus', '--version'])}; {first(['tc', '-V'])}; {first(['nft', '--version'])}; "
            f"Python {platform.python_version()}; torch {tv}; gpunet-exporter "
            f"{first([tool('gpunet-exporter'), '--version']).removeprefix('gpunet-exporter ')}.")


# --- trace checks ---------------------------------------------------------------------------------------
# The diagnoser's own trace reader and counter arithmetic: one way to read a trace.
NO_POINTS = (np.array([]), np.array([]))


def read_trace(path: Path, names: set[str]) -> dict[tuple[str, frozenset], tuple[np.ndarray, np.ndarray]]:
    return {(s.name, frozenset(s.labels.items())): (s.timestamps, s.values)
            for s in replay.read_trace(path, lambda name: name in names)}


def increase(points: tuple[np.ndarray, np.ndarray], t1: float, t2: float) -> float:
    """Counter increase between t1 and t2 (resets: counted from 0)."""
    return float(counter_increase(points[0], points[1], np.array([t1, t2 + 1e-6]))[0])


def summarize(path: Path, labels: dict) -> str:
    names = {"gpunet_nic_transmit_bytes_total", "gpunet_nic_receive_bytes_total", "gpunet_nic_saturated_seconds_total",
             "gpunet_tcp_retransmitted_segments_total", "gpunet_tcp_sent_segments_total",
             "gpunet_gpu_idle_seconds_total", "gpunet_gpu_busy_seconds_total"}
    s = read_trace(path, names)
    first = min(float(t[0]) for t, _ in s.values() if len(t))
    last = max(float(t[-1]) for t, _ in s.values() if len(t))
    inc = labels["incidents"][0]
    windows = [("before", first, inc["start"]), ("incident", inc["start"], inc["end"]), ("after", inc["end"], last)]
    windows = [w for w in windows if w[2] - w[1] >= SCRAPE_INTERVAL]
    lines = [f"{path.name}: {first:.0f}..{last:.0f} ({last - first:.0f} s), {len(s)} series of interest; "
             f"ground truth {inc['class']} {inc['start']:.0f}..{inc['end']:.0f} on {inc['nodes']}"]
    missing = [n for n in ("gpunet_nic_transmit_bytes_total", "gpunet_tcp_retransmitted_segments_total")
               if not any(k[0] == n for k in s)]
    if missing:
        lines.append(f"  MISSING: {missing}")

    def get(name, inst, **kw):
        want = {("instance", inst), *kw.items()}
        return next((pts for (n, lab), pts in s.items() if n == name and want <= lab), None)

    for node in (NODE_A, NODE_B):
        for wname, t1, t2 in windows:
            dur = t2 - t1
            parts = []
            tx = get("gpunet_nic_transmit_bytes_total", node, device="fab0")
            rx = get("gpunet_nic_receive_bytes_total", node, device="fab0")
            if tx and rx:
                parts.append(f"fab0 tx {increase(tx, t1, t2) * 8 / dur / 1e6:.0f} / rx "
                             f"{increase(rx, t1, t2) * 8 / dur / 1e6:.0f} Mbit/s")
            sat = [increase(get("gpunet_nic_saturated_seconds_total", node, device="fab0", direction=d) or NO_POINTS, t1, t2)
                   for d in ("transmit", "receive")]
            parts.append(f"saturated tx {sat[0]:.0f} s rx {sat[1]:.0f} s")
            rt = get("gpunet_tcp_retransmitted_segments_total", node)
            sg = get("gpunet_tcp_sent_segments_total", node)
            if rt:
                r, o = increase(rt, t1, t2), increase(sg or NO_POINTS, t1, t2)
                parts.append(f"retrans {r:.0f}" + (f" ({100 * r / o:.2f}% of {o:.0f} segs)" if o else ""))
            busy = get("gpunet_gpu_busy_seconds_total", node, gpu="0")
            if busy:
                idle = {st: increase(get("gpunet_gpu_idle_seconds_total", node, gpu="0", network_state=st) or NO_POINTS,
                                     t1, t2) for st in ("paused", "saturated", "active", "quiet")}
                parts.append(f"gpu0 busy {increase(busy, t1, t2):.0f} s, idle by network_state " +
                             " ".join(f"{k} {v:.1f}" for k, v in idle.items()) + " s")
            lines.append(f"  {node} {wname} ({dur:.0f} s): " + "; ".join(parts))
    return "\n".join(lines)


def check_loads(path: Path) -> str:
    with tempfile.TemporaryDirectory(prefix="gpnrec-load-") as d:
        r = sh([tool("gpunet-trace"), "load", str(path), "--data", d], check=False, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"gpunet-trace load {path} failed: {r.stderr.strip()[-1000:]}")
        return r.stderr.strip()


# --- one trace ------------------------------------------------------------------------------------------
SCENARIOS = {
    # kind, which --*-rate-mbit shapes fab0, TCP SACK on the nodes, loss injected
    "real-bandwidth": {"kind": "job", "rate": "rate_mbit", "sack": True, "loss": False},
    "real-loss": {"kind": "job", "rate": "loss_rate_mbit", "sack": False, "loss": True},
    "real-iperf3": {"kind": "iperf3", "rate": "rate_mbit", "sack": True, "loss": False},
    "real-loss-sack": {"kind": "job", "rate": "loss_rate_mbit", "sack": True, "loss": True},
}


def record(name: str, cfg: argparse.Namespace, outdir: Path) -> str:
    spec = SCENARIOS[name]
    work = Path(tempfile.mkdtemp(prefix=f"gpnrec-{name}-"))
    lab = Lab(getattr(cfg, spec["rate"]), work)
    ok = False
    try:
        lab.build()
        log(f"{name}: namespaces {lab.a.name} {lab.b.name} {lab.m.name}; fab0 tbf {lab.rate_mbit} Mbit/s; work {work}")
        if not spec["sack"]:
            for ns in (lab.a, lab.b):  # per-namespace sysctl: the host's TCP is untouched
                ns.run(["sysctl", "-qw", "net.ipv4.tcp_sack=0"])
        result = (run_job_scenario if spec["kind"] == "job" else run_iperf3_scenario)(lab, cfg, name)
        # Until Prometheus has scraped past the end of the window.
        time.sleep(SCRAPE_INTERVAL + 2)
        trace = outdir / f"{name}.om.gz"
        r = lab.m.run([tool("gpunet-trace"), "export", "--prometheus", f"http://{PROM_LISTEN}",
                       "--start", f"{result.start:.3f}", "--end", f"{result.end:.3f}", "--match", '{job="gpunet"}',
                       str(trace)], timeout=300)
        log(f"{name}: {r.stderr.strip().splitlines()[-1]}")
        labels = {"incidents": result.incidents, "notes": result.notes}
        (outdir / f"{name}.labels.json").write_text(json.dumps(labels, indent=2) + "\n")
        loaded = check_loads(trace)
        summary = summarize(trace, labels)
        size = trace.stat().st_size
        ok = True
        return f"{summary}\n  {size / 1024:.0f} KiB gzipped; gpunet-trace load: {loaded}"
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            lab.close()
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            if ok and not cfg.keep_work:
                shutil.rmtree(work, ignore_errors=True)
            else:
                log(f"{name}: logs and Prometheus data kept in {work}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_rank":
        return rank_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("outdir", help="where NAME.om.gz and NAME.labels.json go (e.g. replay_data/real)")
    p.add_argument("--traces", default=",".join(SCENARIOS),
                   help="comma-separated, of: " + ", ".join(SCENARIOS))
    p.add_argument("--lead", type=float, default=45, help="seconds of healthy lead-in (default 45)")
    p.add_argument("--incident", type=float, default=150, help="seconds of incident (default 150)")
    p.add_argument("--tail", type=float, default=30, help="seconds of healthy tail (default 30)")
    p.add_argument("--rate-mbit", type=int, default=200, help="tbf rate of fab0 for bandwidth/iperf3 (default 200)")
    p.add_argument("--loss-rate-mbit", type=int, default=1000, help="tbf rate of fab0 for the loss trace (default 1000)")
    p.add_argument("--grad-mb", type=float, default=25, help="gradient per step in the bandwidth incident (MB)")
    p.add_argument("--small-mb", type=float, default=1, help="gradient per step outside it (MB)")
    p.add_argument("--loss-grad-mb", type=float, default=8, help="gradient per step in the loss trace (MB)")
    p.add_argument("--loss-pct", type=int, default=3, help="percent of node-a -> node-b packets dropped (default 3)")
    p.add_argument("--compute", type=float, default=0.8, help="seconds of compute per step (default 0.8)")
    p.add_argument("--keep-work", action="store_true", help="keep logs and Prometheus data of each run")
    cfg = p.parse_args(argv)
    names = [n.strip() for n in cfg.traces.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown trace(s) {unknown}; choose from {list(SCENARIOS)}")
    if os.geteuid() != 0:
        p.error("needs root (network namespaces, tc, nftables)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        p.error("missing tools: " + ", ".join(missing))
    if any(SCENARIOS[n]["kind"] == "job" for n in names):
        try:
            import torch.distributed as dist
            if not dist.is_gloo_available():
                raise ImportError("torch without gloo")
        except ImportError as e:
            p.error(f"the training-job traces need torch with gloo ({e}); `pip install torch` (CPU build), "
                    f"or record only real-iperf3")
    outdir = Path(cfg.outdir)
    outdir.mkdir(parents=True, exist_ok=True)

    # SIGTERM/SIGHUP end the run like Ctrl-C: through the finally blocks.
    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    remove_stale_namespaces()
    summaries = []
    try:
        for name in names:
            summaries.append(record(name, cfg, outdir))
            print(summaries[-1], flush=True)
    except KeyboardInterrupt:
        log("interrupted: everything started was ended and the namespaces deleted")
        return 130
    print("\n== summary ==\n" + "\n".join(summaries), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
