"""The GPU collector on a real NVIDIA GPU: one prepared check.

    python bench/gpu_check.py --out /tmp/gpu-check       # needs a GPU, NVML and torch

Starts the exporter on this machine, loads GPU 0 with a torch matmul loop for 20 s, lets
it idle 10 s, and scrapes before, between and after. Prints busy seconds per phase (they
must track the load), the GPM metrics (Hopper and newer), the throttle and collector
state; mid-load, which workload the exporter attributes GPU 0 to (NVML's compute
processes: the torch process must show, source "process") and the GPU's PCIe link under
load and idle (GPUs lower the transfer rate when idle);
then writes `gpunet-exporter snapshot` of the machine to OUT/fixture (to be
committed as a test fixture) and the figures to OUT/report.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + {seconds}
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples}


def value(m: dict, name: str, **labels) -> float | None:
    return m.get((name, tuple(sorted(labels.items()))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, default=19845)
    p.add_argument("--load-seconds", type=float, default=20.0)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    url = f"http://127.0.0.1:{args.port}"
    exporter = subprocess.Popen([sys.executable, "-m", "exporter", "--listen", f"127.0.0.1:{args.port}"],
                                env=env, stderr=open(out / "exporter.log", "wb"))
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(2.5)  # two slow ticks: GPM needs two samples
        before, t0 = scrape(url), time.monotonic()
        load = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=args.load_seconds)], env=env)
        time.sleep(min(args.load_seconds * 0.75, 15.0))  # past a workload refresh (10 s)
        mid = scrape(url)
        if load.wait() != 0:
            raise SystemExit("the torch load failed")
        loaded, t1 = scrape(url), time.monotonic()
        time.sleep(args.idle_seconds)
        idle, t2 = scrape(url), time.monotonic()
        gpus = sorted({dict(k)["gpu"] for (n, k) in before if n == "gpunet_gpu_busy_seconds_total"}, key=int)
        report = {"load_seconds": t1 - t0, "idle_seconds": t2 - t1, "gpus": {}}
        print(f"{'gpu':>4} {'busy/load':>10} {'busy/idle':>10} {'sm_active':>10} {'tensor':>8} {'clock MHz':>10}")
        for gpu in gpus:
            busy = [value(m, "gpunet_gpu_busy_seconds_total", gpu=gpu) for m in (before, loaded, idle)]
            row = {"busy_fraction_load": (busy[1] - busy[0]) / (t1 - t0),
                   "busy_fraction_idle": (busy[2] - busy[1]) / (t2 - t1),
                   "sm_active_during_load": value(loaded, "gpunet_gpu_sm_active_ratio", gpu=gpu),
                   "tensor_active_during_load": value(loaded, "gpunet_gpu_tensor_active_ratio", gpu=gpu),
                   "sm_clock_hz": value(loaded, "gpunet_gpu_sm_clock_hertz", gpu=gpu),
                   "throttled": {dict(k)["reason"]: v for (n, k), v in loaded.items()
                                 if n == "gpunet_gpu_throttled_seconds_total" and dict(k)["gpu"] == gpu and v}}
            report["gpus"][gpu] = row
            print(f"{gpu:>4} {row['busy_fraction_load']:>10.3f} {row['busy_fraction_idle']:>10.3f} "
                  f"{row['sm_active_during_load'] or float('nan'):>10.3f} "
                  f"{row['tensor_active_during_load'] or float('nan'):>8.3f} {(row['sm_clock_hz'] or 0) / 1e6:>10.0f}")
        report["workload_gpu0_mid_load"] = [dict(k) for (n, k) in mid
                                            if n == "gpunet_gpu_workload_info" and dict(k).get("gpu") == "0"]
        report["pcie_gpu0"] = {phase: {name.removeprefix("gpunet_gpu_pcie_"): value(m, name, gpu="0")
                                       for name in ("gpunet_gpu_pcie_current_link_transfers_per_second",
                                                    "gpunet_gpu_pcie_max_link_transfers_per_second",
                                                    "gpunet_gpu_pcie_current_link_width",
                                                    "gpunet_gpu_pcie_max_link_width")}
                               for phase, m in (("load", mid), ("idle", idle))}
        print("GPU 0 workload mid-load:", report["workload_gpu0_mid_load"] or "none")
        print("GPU 0 PCIe (load, idle):", report["pcie_gpu0"])
        report["collectors_up"] = {dict(k)["collector"]: v for (n, k), v in idle.items()
                                   if n == "gpunet_exporter_collector_up"}
        gpu0 = report["gpus"].get("0", {})
        report["pass"] = bool(gpu0) and gpu0["busy_fraction_load"] > 0.9 and gpu0["busy_fraction_idle"] < 0.1
        print("busy seconds track the load:", "PASS" if report["pass"] else "FAIL")
        print("collectors up:", report["collectors_up"])
    finally:
        exporter.terminate()
        exporter.wait(10)
    subprocess.run([sys.executable, "-m", "exporter", "snapshot", str(out / "fixture")], env=env, check=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
