"""Labelled trace sets: the small committed one (replay_data/) and fresh evaluation suites.

    python -m gpunet.simulate.suite replay_data/                      # regenerate the committed set
    python -m gpunet.simulate.suite --evaluation OUTDIR --seed 1000   # a fresh evaluation suite

Every trace is one `gpunet-simulate` command line (the same parser as the CLI), so each
labels.json note carries the exact command that made it, and regeneration is deterministic
(same seeds, same bytes: the gzip stream has no timestamp).

The evaluation suite draws new seeds and parameters from --seed and covers every class,
healthy traces with confounders, two-incident and overlapping traces, subtle faults adding
5-8 points of GPU idle, single culprits among 64-128 nodes, 60 s scrapes with 3-5 minute
incidents, congestion without ECN, loss over TCP. It writes manifest.json (name, command, tags, incidents) beside the traces.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpunet.simulate.cli import generate


@dataclass
class Entry:
    name: str
    summary: str
    args: str
    tags: list[str] = field(default_factory=list)

    def argv(self, outdir: Path) -> list[str]:
        return shlex.split(self.args) + [str(outdir / f"{self.name}.om.gz")]


SMALL = "--gpus 4 --nics 2 --compress-level 9"
COMMITTED: list[Entry] = [
    Entry("healthy_basic", "healthy job; the steady DCQCN background of a healthy RoCE fabric",
          f"--nodes 8 {SMALL} --duration 30m --scrape 30s --seed 101"),
    Entry("healthy_confounders", "healthy; checkpoint stalls with storage writes over eno1, busier DCQCN background, "
          "spare RDMA port down, unused GPUs, a node without GPU series, an exporter restart",
          f"--nodes 8 {SMALL} --duration 40m --scrape 30s --seed 102 "
          "--confounder checkpoint:every=15m,dur=2m --confounder dcqcn_background:level=6 "
          "--confounder spare_port:nodes=3 --confounder unused_gpus:nodes=2,gpus=1 "
          "--confounder missing_gpu_series:nodes=1 --confounder exporter_restart:nodes=2"),
    Entry("healthy_join_leave", "healthy; dgx hostnames on :9100, a node joins and one leaves monitoring, short "
          "async checkpoints (quiet idle), backups on eno1",
          f"--nodes 8 {SMALL} --duration 30m --scrape 30s --seed 103 --hostname-style dgx --port 9100 "
          "--confounder node_join:nodes=1 --confounder node_leave:nodes=1 "
          "--confounder checkpoint:every=10m,variant=async --confounder backup:nodes=3"),
    Entry("network_bandwidth_25g", "25G links too slow for the model all along: NICs at line rate, GPUs idle in "
          "saturated, no congestion signals (incident = whole trace)",
          f"--nodes 8 {SMALL} --nic-speed 25G --duration 30m --scrape 30s --seed 104 "
          "--fault network_bandwidth:start=0,dur=all,strength=2.5"),
    Entry("network_congestion", "fabric congestion: ECN marks and CNPs jump, moderate received pauses, "
          "throughput well below line rate",
          f"--nodes 12 {SMALL} --duration 30m --scrape 30s --seed 105 --fault network_congestion:start=12m,dur=10m"),
    Entry("network_congestion_no_ecn", "congestion on a fabric without ECN: only received pauses and lower "
          "throughput", f"--nodes 8 {SMALL} --duration 30m --scrape 30s --seed 106 "
          "--fault network_congestion:start=10m,dur=10m,variant=no_ecn"),
    Entry("network_congestion_ib", "congestion on an InfiniBand fabric: no pauses or marks, the ports wait for "
          "credit (port_xmit_wait) far more per byte, throughput well below line rate",
          f"--nodes 6 {SMALL} --link-layer infiniband --duration 30m --scrape 30s --seed 117 "
          "--fault network_congestion:start=11m,dur=9m"),
    Entry("pfc_storm", "one host's NICs transmit PFC pauses continuously; all other nodes receive pauses; "
          "throughput collapses", f"--nodes 12 {SMALL} --duration 30m --scrape 30s --seed 107 "
          "--fault pfc_storm:start=13m,dur=9m,nodes=1"),
    Entry("packet_loss_link", "a lossy port (bad optic): go-back-N loss events on it and its ring neighbours, "
          "throughput collapses; rack hostnames",
          f"--nodes 12 {SMALL} --duration 30m --scrape 30s --seed 108 --hostname-style rack "
          "--fault packet_loss:start=12m,dur=8m,nodes=1"),
    Entry("packet_loss_tcp", "loss over a TCP transport (NCCL sockets): TCP retransmits on the sending node, "
          "no RDMA loss counters", f"--nodes 8 {SMALL} --duration 30m --scrape 30s --seed 109 --transport tcp "
          "--fault packet_loss:start=10m,dur=10m,nodes=1"),
    Entry("link_degraded_downshift", "one 400G port renegotiates at 200G: its NIC saturated, peers half busy, "
          "the job slows", f"--nodes 8 {SMALL} --nic-speed 400G --duration 30m --scrape 30s --seed 110 "
          "--fault link_degraded:start=10m,dur=10m,speed=200G"),
    Entry("link_degraded_flap", "a flapping link: carrier changes, nic_up dips, ACK timeouts, the ring stalls",
          f"--nodes 6 {SMALL} --duration 25m --scrape 15s --seed 111 "
          "--fault link_degraded:start=12m,dur=8m,variant=flap,strength=0.2"),
    Entry("gpu_throttle", "one node's GPUs power-braked: throttle reasons, low SM clock, the others wait; "
          "10-0-x-y hostnames", f"--nodes 12 {SMALL} --duration 30m --scrape 30s --seed 112 --hostname-style ip "
          "--fault gpu_throttle:start=10m,dur=10m,variant=power"),
    Entry("straggler_trickle", "one node computes slower with no visible cause; the others idle with a trickle "
          "of early buckets", f"--nodes 8 {SMALL} --duration 30m --scrape 30s --seed 113 "
          "--fault straggler:start=10m,dur=10m,variant=trickle"),
    Entry("host_bound", "input pipeline starves every GPU: idle in quiet everywhere, nobody stands out",
          f"--nodes 8 {SMALL} --duration 30m --scrape 30s --seed 114 --fault host_bound:start=12m,dur=10m"),
    Entry("two_incidents", "a PFC storm, later a throttled node",
          f"--nodes 8 {SMALL} --duration 50m --scrape 30s --seed 115 "
          "--fault pfc_storm:start=10m,dur=8m --fault gpu_throttle:start=32m,dur=12m,variant=thermal"),
    Entry("two_incidents_overlapping", "a flapping link inside a host-bound stretch",
          f"--nodes 8 {SMALL} --duration 45m --scrape 30s --seed 116 "
          "--fault host_bound:start=10m,dur=20m --fault link_degraded:start=18m,dur=8m,variant=flap"),
]


def generate_all(entries: list[Entry], outdir: Path, quiet: bool = False) -> list[dict]:
    outdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for e in entries:
        t0 = time.perf_counter()
        stats = generate(e.argv(outdir))
        rows.append({"name": e.name, "summary": e.summary, "command": "gpunet-simulate " + e.args + f" {e.name}.om.gz",
                     "tags": e.tags, "incidents": stats["incidents"], "series": stats["series"],
                     "samples": stats["samples"], "bytes": stats["bytes"], "idle": round(stats["idle"], 3)})
        if not quiet:
            print(f"{e.name}: {stats['series']} series, {stats['bytes'] / 1e3:.0f} kB, "
                  f"{len(stats['incidents'])} incident(s), {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return rows


BEGIN, END = "<!-- BEGIN simulated traces (python -m gpunet.simulate.suite) -->", "<!-- END simulated traces -->"


def update_readme(path: Path, rows: list[dict]) -> None:
    """Rewrite the simulated-traces block of README.md, keeping whatever else it says
    (real recorded traces are described beside them)."""
    block = f"{BEGIN}\n{readme(rows)}{END}\n"
    text = path.read_text() if path.exists() else "# replay_data: labelled replay traces\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def readme(rows: list[dict]) -> str:
    total = sum(r["bytes"] for r in rows)
    lines = [
        "## Simulated traces",
        "",
        "Simulated traces (docs/trace-format.md) with their ground truth, for the diagnoser's tests.",
        "Each `NAME.om.gz` is OpenMetrics with a timestamp on every sample; `NAME.labels.json` lists",
        "the injected incidents (class, start, end, culprit instances) and, in `notes`, the exact",
        "command, the culprit devices/GPUs and the confounders present.",
        "",
        "Regenerate them all (deterministic: same bytes):",
        "",
        "```sh",
        "python -m gpunet.simulate.suite replay_data/",
        "```",
        "",
        "The list of traces is `COMMITTED` in `gpunet/simulate/suite.py`. For a fresh, larger",
        "evaluation suite with other seeds and parameters (not committed):",
        "`python -m gpunet.simulate.suite --evaluation OUTDIR --seed 1000`.",
        "The simulator itself: `gpunet-simulate --help`, and `gpunet/simulate/` (physics in",
        "`physics.py`, each fault's signature explained in `faults.py`).",
        "",
        "Every trace starts 2026-01-01T00:00:00Z (Unix 1767225600); times below are minutes from there.",
        "",
        "| trace | what | nodes x GPUs x NICs, scrape | incidents (class, minutes, culprits) | GPU idle | size |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        args = r["command"].split()

        def opt(name, default):
            return args[args.index(name) + 1] if name in args else default
        shape = (f"{opt('--nodes', '16')} x {opt('--gpus', '8')} x {opt('--nics', '4')} @ "
                 f"{opt('--nic-speed', '200G')}, {opt('--scrape', '15s')}, {opt('--duration', '1h')}")
        incs = "; ".join(f"{i['class']} {(i['start'] - 1767225600) / 60:g}-{(i['end'] - 1767225600) / 60:g}"
                         + (f" {', '.join(n.split(':')[0] for n in i['nodes'])}" if i["nodes"] else "")
                         for i in r["incidents"]) or "none (healthy)"
        lines.append(f"| `{r['name']}` | {r['summary']} | {shape} | {incs} | {100 * r['idle']:.0f}% | "
                     f"{r['bytes'] / 1e3:.0f} kB |")
    lines += ["", f"{len(rows)} traces, {total / 1e6:.1f} MB in all. GPU idle: mean over the whole trace.", ""]
    return "\n".join(lines)


# --- evaluation suites ------------------------------------------------------------------------------

CLASSES = ("network_bandwidth", "network_congestion", "pfc_storm", "packet_loss", "link_degraded", "gpu_throttle",
           "straggler", "host_bound")
LOCALISED = {"pfc_storm", "packet_loss", "link_degraded", "gpu_throttle", "straggler"}


def _fault(rng: np.random.Generator, cls: str, start_min: float, dur_min: float, extra: str = "") -> str:
    variant = {
        "network_congestion": rng.choice(["", "", "variant=no_ecn"]),
        "packet_loss": rng.choice(["", "", "variant=fabric"]),
        "link_degraded": rng.choice(["", "variant=flap"]),
        "gpu_throttle": rng.choice(["variant=thermal", "variant=power", "variant=hw_slowdown"]),
        "straggler": rng.choice(["variant=quiet", "variant=trickle"]),
    }.get(cls, "")
    opts = [f"start={start_min:g}m", f"dur={dur_min:g}m"]
    if variant and variant not in extra:
        opts.append(str(variant))
    if extra:
        opts.append(extra)
    return f"--fault {cls}:{','.join(opts)}"


def evaluation_entries(seed: int) -> list[Entry]:
    """>= 40 traces drawn from `seed` (same seed, same suite)."""
    rng = np.random.default_rng(seed)
    out: list[Entry] = []
    n = 0

    def base(nodes=None, scrape=None, duration=None, extra=""):
        nonlocal n
        n += 1
        nodes = nodes or int(rng.choice([8, 12, 16, 24, 32]))
        gpus = int(rng.choice([4, 8]))
        nics = int(rng.choice([1, 2, 4, 8]))
        speed = str(rng.choice(["100G", "200G", "200G", "400G"]))
        scrape = scrape or str(rng.choice(["10s", "15s", "15s", "30s"]))
        duration = duration or str(rng.choice(["30m", "40m", "45m"]))
        style = str(rng.choice(["node", "rack", "dgx", "ip"]))
        port = str(rng.choice(["9845", "9845", "9100"]))
        return (f"--nodes {nodes} --gpus {gpus} --nics {nics} --nic-speed {speed} --scrape {scrape} "
                f"--duration {duration} --hostname-style {style} --port {port} --seed {seed + n} {extra}").strip()

    def dur_of(args: str) -> float:
        return float(args.split("--duration ")[1].split("m")[0])

    # every class, twice, with varied clusters
    for cls in CLASSES:
        for rep in range(2):
            args = base()
            d = dur_of(args)
            length = float(rng.uniform(5, 12))
            start = float(rng.uniform(5, d - length - 2))
            if cls == "packet_loss" and rep == 1:
                args += " --transport tcp"
            if cls == "straggler" and rep == 1:
                args += " --wait-traffic trickle"
            out.append(Entry(f"{cls}_{rep}", f"{cls}", args + " " + _fault(rng, cls, round(start, 1), round(length, 1)),
                             [cls]))
    # subtle faults: +5-8 points of GPU idle
    for cls in CLASSES:
        args = base()
        d = dur_of(args)
        start = float(rng.uniform(5, d - 14))
        spec = _fault(rng, cls, round(start, 1), 10, "subtle=1")
        out.append(Entry(f"subtle_{cls}", f"subtle {cls}", f"{args} {spec}", [cls, "subtle"]))
    # single culprits among 64-128 nodes
    for cls in ("pfc_storm", "packet_loss", "link_degraded", "gpu_throttle", "straggler"):
        nodes = int(rng.choice([64, 96, 128]))
        args = base(nodes=nodes, scrape="30s", duration="30m").replace("--gpus 8", "--gpus 4")
        out.append(Entry(f"big_{cls}", f"{cls}, one culprit among {nodes}", args + " " + _fault(rng, cls, 12, 8),
                         [cls, "big"]))
    # 60 s scrapes, 3-5 minute incidents
    for cls in ("network_congestion", "pfc_storm", "gpu_throttle", "link_degraded"):
        args = base(scrape="60s")
        out.append(Entry(f"scrape60_{cls}", f"{cls}, 60 s scrapes", args + " " +
                         _fault(rng, cls, round(float(rng.uniform(8, 20)), 1), round(float(rng.uniform(3, 5)), 1)),
                         [cls, "scrape60"]))
    # specific variants
    out.append(Entry("congestion_no_ecn", "congestion without ECN",
                     base() + " " + _fault(rng, "network_congestion", 10, 10, "variant=no_ecn"),
                     ["network_congestion", "no_ecn"]))
    out.append(Entry("loss_tcp", "packet loss over TCP transport",
                     base(extra="--transport tcp") + " " + _fault(rng, "packet_loss", 12, 8), ["packet_loss", "tcp"]))
    # two incidents, apart and overlapping
    pairs = [("pfc_storm", "straggler"), ("gpu_throttle", "network_congestion"), ("host_bound", "link_degraded")]
    for a, b in pairs:
        args = base(duration="60m")
        faults = _fault(rng, a, 8, 10) + " " + _fault(rng, b, 35, 12)
        out.append(Entry(f"two_{a}_{b}", f"{a} then {b}", f"{args} {faults}", [a, b, "two"]))
    overl = [("network_congestion", "gpu_throttle"), ("host_bound", "pfc_storm"), ("straggler", "packet_loss")]
    for a, b in overl:
        args = base(duration="45m")
        out.append(Entry(f"overlap_{a}_{b}", f"{a} overlapping {b}",
                         args + " " + _fault(rng, a, 10, 20) + " " + _fault(rng, b, 18, 8), [a, b, "overlap"]))
    # healthy traces with confounders
    confs = [
        "--confounder checkpoint:every=12m,dur=2m",
        "--confounder dcqcn_background:level=10",
        "--confounder spare_port:nodes=all",
        "--confounder unused_gpus:nodes=3,gpus=2",
        "--confounder missing_gpu_series:nodes=1 --confounder exporter_restart:nodes=2",
        "--confounder node_join:nodes=1 --confounder node_leave:nodes=1 "
        "--confounder checkpoint:every=10m,variant=async",
        "--confounder checkpoint:every=15m,dur=3m --confounder dcqcn_background:level=5 --confounder backup:nodes=4",
    ]
    for j, c in enumerate(confs):
        out.append(Entry(f"healthy_{j}", "healthy with confounders", base() + " " + c, ["healthy"]))
    # InfiniBand: credits, not pauses (drawn last, so the entries above stay as they were)
    ib = "--link-layer infiniband"
    out.append(Entry("ib_healthy", "healthy on InfiniBand", base(extra=ib), ["healthy", "infiniband"]))
    for cls in ("network_congestion", "link_degraded", "straggler"):
        fault = _fault(rng, cls, round(float(rng.uniform(8, 20)), 1), round(float(rng.uniform(6, 12)), 1))
        fault = fault.replace(",variant=no_ecn", "")  # a RoCE variant: InfiniBand marks nothing either way
        out.append(Entry(f"ib_{cls}", f"{cls} on InfiniBand", base(extra=ib) + " " + fault, [cls, "infiniband"]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpunet.simulate.suite", description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", nargs="?", help="write the committed set here (replay_data/)")
    p.add_argument("--evaluation", metavar="OUTDIR", help="write a fresh evaluation suite here instead")
    p.add_argument("--seed", type=int, default=1000, help="evaluation suite seed")
    p.add_argument("--only", nargs="*", help="only these trace names")
    p.add_argument("--list", action="store_true", help="print the commands, generate nothing")
    args = p.parse_args(argv)
    if args.evaluation:
        entries, outdir = evaluation_entries(args.seed), Path(args.evaluation)
    elif args.outdir:
        entries, outdir = COMMITTED, Path(args.outdir)
    else:
        p.error("give OUTDIR (the committed set) or --evaluation OUTDIR")
    if args.only:
        entries = [e for e in entries if e.name in args.only]
    if args.list:
        for e in entries:
            print(f"{e.name}: gpunet-simulate {e.args} {e.name}.om.gz")
        return 0
    t0 = time.perf_counter()
    rows = generate_all(entries, outdir)
    if args.evaluation:
        (outdir / "manifest.json").write_text(json.dumps({"seed": args.seed, "traces": rows}, indent=1) + "\n")
    elif not args.only:
        update_readme(outdir / "README.md", rows)
    print(f"{len(rows)} traces in {time.perf_counter() - t0:.0f} s, {sum(r['bytes'] for r in rows) / 1e6:.1f} MB "
          f"-> {outdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
