"""The GPU collectors on a real NVIDIA GPU: one prepared check (issue 17's GPU figures).

    python bench/gpu_check.py --out /tmp/gpu-check       # needs a GPU, NVML and torch
    python bench/gpu_check.py --out /tmp/dry --gpu-fixture tests/fixtures/nodes/h100-8gpu/nvml.json

Starts the exporter on this machine with loopback as its one fabric NIC, declared 1 Gbit/s
(`--nic-include '^lo$' --fabric-devices lo --link-speed lo=1Gbit`), so that a TCP transfer
over 127.0.0.1, which runs at tens of Gbit/s, is a real transfer that saturates the fabric
without root, a namespace or a second machine. Then four phases, scraped between them:

1. load: GPU 0 runs a torch matmul loop (--load-seconds), no transfer: busy seconds must
   track the load;
2. quiet: nothing runs (--idle-seconds): GPU idle time goes to network_state "quiet";
3. transfer: GPU idle while a TCP transfer runs over loopback (--idle-seconds): GPU idle
   time goes to "saturated", the idle split during a real transfer;
4. the NVML calls themselves, in this process through the exporter's own backend: CPU per
   call and per GPU for what a fast tick asks (activity without the SM clock), the refresh
   tick (with it) and the slow tick (details, health); and the driver's utilization sample
   buffer of GPU 0 (how many samples, how far apart, how old the newest is against the host
   clock), which tells whether reading it once a second, as the exporter does, keeps inside
   the buffer, and whether its stamps are the host's wall clock (the exporter places them by
   their spacing otherwise: exporter/readers/nvml.py, on_monotonic_clock).

Mid-load it also records which workload the exporter gives GPU 0 (the torch process must
show, source "process") and the GPU's PCIe link under load and idle; then writes
`gpunet-exporter snapshot` of the machine to OUT/fixture (to be committed as a test
fixture) and the figures to OUT/report.json.

With --gpu-fixture the GPUs come from that nvml.json (utilization set to 0 in a copy: idle
GPUs), there is no load and no NVML phase: a dry run of the transfer phase and of the
script itself on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + {seconds}
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""
FABRIC = ["--nic-include", "^lo$", "--fabric-devices", "lo", "--link-speed", "lo=1Gbit"]
STATES = ("paused", "saturated", "active", "quiet")


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples}


def value(m: dict, name: str, **labels) -> float | None:
    return m.get((name, tuple(sorted(labels.items()))))


def delta(a: dict, b: dict, name: str, **labels) -> float:
    """How much a counter grew between two scrapes (absent: 0)."""
    return (value(b, name, **labels) or 0.0) - (value(a, name, **labels) or 0.0)


def by_state(a: dict, b: dict, name: str, **labels) -> dict[str, float]:
    """The growth of a counter split by network_state, between two scrapes."""
    return {s: delta(a, b, name, network_state=s, **labels) for s in STATES}


def transfer(seconds: float) -> float:
    """A TCP transfer over 127.0.0.1 for `seconds`; its rate in bits per second."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 20):
                pass

    reader = threading.Thread(target=sink, daemon=True)
    reader.start()
    sent, chunk = 0, b"\0" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(chunk)
            sent += len(chunk)
    reader.join(5)
    server.close()
    return sent * 8 / seconds


def median_us(fn, n: int) -> float:
    """Median CPU time of one call, in µs (process CPU: NVML may work on threads of its own)."""
    times = []
    for _ in range(n):
        t0 = time.process_time_ns()
        fn()
        times.append((time.process_time_ns() - t0) / 1e3)
    return statistics.median(times)


def nvml_costs(gpus: list[str]) -> dict:
    """CPU per NVML question, through the exporter's own backend, and GPU 0's sample buffer."""
    from exporter.readers.nvml import NVML_GPU_UTILIZATION_SAMPLES, NvmlGpus
    from exporter.root import Root

    backend = NvmlGpus(Root("/"))
    backend.open()
    out: dict = {"per_gpu_us": {}}
    try:
        for gpu in gpus:
            i = int(gpu)
            out["per_gpu_us"][gpu] = {
                "fast tick: activity without SM clock": median_us(lambda: backend.activity(i, False), 200),
                "refresh tick: activity with SM clock": median_us(lambda: backend.activity(i, True), 200),
                "slow tick: details": median_us(lambda: backend.details(i), 50),
                "slow tick: health": median_us(lambda: backend.health(i), 50),
            }
        fast = [row["fast tick: activity without SM clock"] for row in out["per_gpu_us"].values()]
        out["fast_tick_all_gpus_us"] = sum(fast)
        nv, handle = backend._nvml, backend._gpus[0].handle
        _, samples = nv.nvmlDeviceGetSamples(handle, NVML_GPU_UTILIZATION_SAMPLES, 0)
        stamps = sorted(s.timeStamp for s in samples)
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        out["gpu0_sample_buffer"] = {
            "samples": len(stamps),
            "median_period_ms": statistics.median(gaps) / 1e3 if gaps else None,
            "spans_s": (stamps[-1] - stamps[0]) / 1e6 if stamps else None,
            # NVML stamps samples in microseconds of the host's wall clock: how old the newest is.
            "newest_age_ms": (time.time() * 1e6 - stamps[-1]) / 1e3 if stamps else None,
            "values": sorted({s.sampleValue.uiVal for s in samples})[:10],
        }
    finally:
        backend.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, default=19845)
    p.add_argument("--load-seconds", type=float, default=20.0)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--gpu-fixture", metavar="NVML_JSON",
                   help="dry run without a GPU: GPUs from this nvml.json, made idle; no load, no NVML phase")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    url = f"http://127.0.0.1:{args.port}"
    flags = list(FABRIC)
    if args.gpu_fixture:
        doc = json.loads(Path(args.gpu_fixture).read_text())
        for g in doc["gpus"]:
            g["utilization_gpu"] = 0
        (out / "idle-nvml.json").write_text(json.dumps(doc))
        flags += ["--gpu-fixture", str(out / "idle-nvml.json")]
    exporter = subprocess.Popen([sys.executable, "-m", "exporter", "--listen", f"127.0.0.1:{args.port}", *flags],
                                env=env, stderr=open(out / "exporter.log", "wb"))
    report: dict = {"gpus": {}, "dry_run": bool(args.gpu_fixture)}
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1)
                break
            except OSError:
                if exporter.poll() is not None:  # it could not start (a missing dependency, NVML)
                    raise SystemExit(f"the exporter exited {exporter.returncode}:\n"
                                     + (out / "exporter.log").read_text()[-2000:]) from None
                time.sleep(0.1)
        time.sleep(2.5)  # two slow ticks: GPM needs two samples
        before, t0 = scrape(url), time.monotonic()
        mid = before
        if not args.gpu_fixture:
            load = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=args.load_seconds)], env=env)
            time.sleep(min(args.load_seconds * 0.75, 15.0))  # past a workload refresh (10 s)
            mid = scrape(url)
            if load.wait() != 0:
                raise SystemExit("the torch load failed")
        loaded, t1 = scrape(url), time.monotonic()
        time.sleep(args.idle_seconds)
        quiet, t2 = scrape(url), time.monotonic()
        rate = transfer(args.idle_seconds)
        moved, t3 = scrape(url), time.monotonic()
        report.update(load_seconds=t1 - t0, quiet_seconds=t2 - t1, transfer_seconds=t3 - t2,
                      transfer_gbit_per_second=rate / 1e9,
                      network_state_seconds={
                          "quiet": by_state(loaded, quiet, "gpunet_node_network_state_seconds_total"),
                          "transfer": by_state(quiet, moved, "gpunet_node_network_state_seconds_total")})
        gpus = sorted({dict(k)["gpu"] for (n, k) in before if n == "gpunet_gpu_busy_seconds_total"}, key=int)
        print(f"loopback transfer: {rate / 1e9:.1f} Gbit/s over lo declared 1 Gbit/s; node network_state seconds "
              f"{report['network_state_seconds']}")
        print(f"{'gpu':>4} {'busy/load':>10} {'busy/quiet':>10} {'idle quiet->quiet':>18} "
              f"{'idle transfer->saturated':>25} {'sm_active':>10} {'clock MHz':>10}")
        for gpu in gpus:
            split_quiet = by_state(loaded, quiet, "gpunet_gpu_idle_seconds_total", gpu=gpu)
            split_transfer = by_state(quiet, moved, "gpunet_gpu_idle_seconds_total", gpu=gpu)
            row = {"busy_fraction_load": delta(before, loaded, "gpunet_gpu_busy_seconds_total", gpu=gpu) / (t1 - t0),
                   "busy_fraction_quiet": delta(loaded, quiet, "gpunet_gpu_busy_seconds_total", gpu=gpu) / (t2 - t1),
                   "idle_split_quiet": split_quiet, "idle_split_transfer": split_transfer,
                   "sm_active_during_load": value(loaded, "gpunet_gpu_sm_active_ratio", gpu=gpu),
                   "tensor_active_during_load": value(loaded, "gpunet_gpu_tensor_active_ratio", gpu=gpu),
                   "sm_clock_hz": value(loaded, "gpunet_gpu_sm_clock_hertz", gpu=gpu),
                   "throttled": {dict(k)["reason"]: v for (n, k), v in loaded.items()
                                 if n == "gpunet_gpu_throttled_seconds_total" and dict(k)["gpu"] == gpu and v}}
            quiet_share = split_quiet["quiet"] / max(sum(split_quiet.values()), 1e-9)
            busy_share = split_transfer["saturated"] / max(sum(split_transfer.values()), 1e-9)
            row.update(quiet_share=quiet_share, saturated_share_during_transfer=busy_share)
            report["gpus"][gpu] = row
            print(f"{gpu:>4} {row['busy_fraction_load']:>10.3f} {row['busy_fraction_quiet']:>10.3f} "
                  f"{quiet_share:>18.3f} {busy_share:>25.3f} {row['sm_active_during_load'] or float('nan'):>10.3f} "
                  f"{(row['sm_clock_hz'] or 0) / 1e6:>10.0f}")
        report["workload_gpu0_mid_load"] = [dict(k) for (n, k) in mid
                                            if n == "gpunet_gpu_workload_info" and dict(k).get("gpu") == "0"]
        report["pcie_gpu0"] = {phase: {name.removeprefix("gpunet_gpu_pcie_"): value(m, name, gpu="0")
                                       for name in ("gpunet_gpu_pcie_current_link_transfers_per_second",
                                                    "gpunet_gpu_pcie_max_link_transfers_per_second",
                                                    "gpunet_gpu_pcie_current_link_width",
                                                    "gpunet_gpu_pcie_max_link_width")}
                               for phase, m in (("load", mid), ("idle", quiet))}
        print("GPU 0 workload mid-load:", report["workload_gpu0_mid_load"] or "none")
        print("GPU 0 PCIe (load, idle):", report["pcie_gpu0"])
        report["collectors_up"] = {dict(k)["collector"]: v for (n, k), v in moved.items()
                                   if n == "gpunet_exporter_collector_up"}
        print("collectors up:", report["collectors_up"])
        gpu0 = report["gpus"].get("0", {})
        checks = {"idle time goes to quiet with nothing on the wire": gpu0.get("quiet_share", 0) > 0.8,
                  "idle time goes to saturated during the transfer": gpu0.get("saturated_share_during_transfer", 0) > 0.8}
        if not args.gpu_fixture:
            checks["busy seconds track the load"] = (gpu0.get("busy_fraction_load", 0) > 0.9
                                                     and gpu0.get("busy_fraction_quiet", 1) < 0.1)
        report["checks"] = checks
        for what, ok in checks.items():
            print(f"{'PASS' if ok else 'FAIL'}  {what}")
    finally:
        exporter.terminate()
        exporter.wait(10)
    if not args.gpu_fixture:
        try:
            report["nvml"] = nvml_costs(sorted(report["gpus"], key=int))
            print("NVML CPU per call, µs (median), GPU 0:", report["nvml"]["per_gpu_us"].get("0"))
            print(f"NVML for one fast tick, all {len(report['gpus'])} GPUs: "
                  f"{report['nvml']['fast_tick_all_gpus_us']:.0f} µs")
            print("GPU 0 utilization sample buffer:", report["nvml"]["gpu0_sample_buffer"])
        except Exception as e:  # noqa: BLE001 - the figures above are kept whatever NVML says here
            report["nvml"] = {"error": repr(e)}
            print("NVML phase failed:", repr(e))
        subprocess.run([sys.executable, "-m", "exporter", "snapshot", str(out / "fixture")], env=env, check=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return 0 if all(report.get("checks", {}).values()) and report.get("checks") else 1


if __name__ == "__main__":
    sys.exit(main())
