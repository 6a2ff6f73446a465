"""gpunet-simulate: a labelled replay trace of a GPU cluster, from a physical model.

    gpunet-simulate --nodes 16 --gpus 8 --nics 4 --nic-speed 200G --duration 1h --scrape 15s \\
        --seed 1 --fault pfc_storm:start=20m,dur=10m,nodes=1 OUT.om.gz

writes OUT.om.gz (OpenMetrics with timestamps, docs/trace-format.md) and OUT.labels.json (the
incidents injected: class, start, end, culprit instances).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from gpunet.contract import BOTTLENECK_CLASSES
from gpunet.simulate.faults import STRENGTH
from gpunet.simulate.params import (
    CONFIG_FAULTS,
    CONFOUNDERS,
    HOSTNAME_STYLES,
    LINK_LAYERS,
    ClusterParams,
    FabricParams,
    JobParams,
    ScrapeParams,
    SimSpec,
    parse_config_fault,
    parse_confounder,
    parse_duration,
    parse_fault,
    parse_speed,
)
from gpunet.trace import unwritable
from gpunet.window import LAST_SECOND, ArgumentParser

FAULT_HELP = "; ".join(f"{c}: strength = {STRENGTH[c][2]}" for c in BOTTLENECK_CLASSES)
VARIANTS = ("network_congestion: no_ecn; pfc_storm: -; packet_loss: fabric (non-localised; over --transport tcp "
            "the loss shows as TCP retransmits); link_degraded: downshift (speed=100G) | flap; "
            "gpu_throttle: thermal | power | hw_slowdown (gpus=N); straggler: quiet | trickle")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="gpunet-simulate", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=("--fault CLASS:start=20m,dur=10m[,nodes=N|culprits=I+J (0-based)][,variant=V][,strength=X][,subtle=1]"
                "[,nics=N][,gpus=N][,speed=100G]  (dur=all: to the end of the trace)\n"
                f"  classes: {', '.join(BOTTLENECK_CLASSES)}\n  variants: {VARIANTS}\n  {FAULT_HELP}\n"
                "--confounder KIND[:key=value,...]  (never labelled as incidents)\n"
                f"  kinds: {', '.join(CONFOUNDERS)}\n"
                "  e.g. checkpoint:every=20m,dur=90s[,variant=async]  spare_port:nodes=all\n"
                "       unused_gpus:nodes=2,gpus=2  (nodes=N: N nodes at random; nodes=all; nodes=#3+17: those)\n"
                "       missing_gpu_series:nodes=1  exporter_restart:nodes=1,at=30m  node_join:nodes=1,at=10m\n"
                "       node_leave:nodes=1  dcqcn_background:level=8  backup:nodes=4"))
    p.add_argument("out", help="trace file to write (.om.gz or .om)")
    c = p.add_argument_group("cluster")
    c.add_argument("--nodes", type=int, default=16)
    c.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    c.add_argument("--nics", type=int, default=4, help="RDMA NICs (rails) per node, 1..8")
    c.add_argument("--nic-speed", default="200G", help="25G, 100G, 200G, 400G")
    c.add_argument("--mgmt-speed", default="25G", help="management NIC speed")
    c.add_argument("--hostname-style", choices=HOSTNAME_STYLES, default="node",
                   help="node-017 | gpu-h100-r05-u07 | dgx017.cluster.local | 10-0-0-26")
    c.add_argument("--port", type=int, default=9845, help="instance port (9845, or 9100 behind node_exporter)")
    c.add_argument("--job", default="gpunet", help="the job label value")
    c.add_argument("--gpu-model", default="NVIDIA H100 80GB HBM3")
    j = p.add_argument_group("training job")
    j.add_argument("--step-time", default="0.9s", help="forward+backward per step")
    j.add_argument("--input-gap", default="20ms")
    j.add_argument("--overlap", type=float, default=0.7, help="share of the all-reduce hidden behind backward")
    j.add_argument("--comm-ratio", type=float, default=0.4, help="healthy all-reduce time / compute time")
    j.add_argument("--gradient-bytes", type=float, default=None, help="explicit gradient size (overrides --comm-ratio)")
    j.add_argument("--transport", choices=("rdma", "tcp"), default="rdma")
    j.add_argument("--wait-traffic", choices=("quiet", "trickle"), default="quiet",
                   help="what ranks waiting for a straggler send")
    f = p.add_argument_group("fabric")
    f.add_argument("--no-ecn", action="store_true", help="the fabric does not ECN-mark (PFC only)")
    f.add_argument("--link-layer", choices=LINK_LAYERS, default="ethernet",
                   help="ethernet (RoCE: PFC, ECN, CNPs) or infiniband (credits: port_xmit_wait)")
    s = p.add_argument_group("scrape")
    s.add_argument("--duration", default="1h")
    s.add_argument("--scrape", default="15s", help="scrape interval (5s to 60s)")
    s.add_argument("--scrape-jitter", default="10ms")
    s.add_argument("--missing-scrapes", type=float, default=0.002, help="probability a scrape fails")
    s.add_argument("--tick", default="0.2s", help="the exporter's fast tick")
    s.add_argument("--start", type=float, default=1767225600.0, help="Unix time of the trace start")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault", action="append", default=[], metavar="SPEC")
    p.add_argument("--confounder", action="append", default=[], metavar="SPEC")
    p.add_argument("--config-fault", action="append", default=[], metavar="SPEC",
                   help="a configuration mistake on some nodes (never labelled as an incident): "
                        "KIND[:culprits=I+J,...], kinds: " + ", ".join(CONFIG_FAULTS))
    p.add_argument("--compress-level", type=int, default=6)
    p.add_argument("--quiet", action="store_true")
    return p


def flag(name: str, parse, text: str):
    """A flag's value parsed; its mistake named after the flag."""
    try:
        return parse(text)
    except ValueError as e:
        raise ValueError(f"--{name} {text}: {e}") from None


def spec_from_args(args: argparse.Namespace, argv: list[str] | None = None) -> SimSpec:
    duration = flag("duration", parse_duration, args.duration)
    if not 60 <= duration <= 30 * 86400:
        raise ValueError(f"--duration {args.duration}: 1m to 30d")
    if not 0 <= args.start < LAST_SECOND:  # also false for NaN
        raise ValueError(f"--start {args.start}: Unix seconds from 0 to {LAST_SECOND:.0f}")
    if not 0 <= args.compress_level <= 9:
        raise ValueError(f"--compress-level {args.compress_level}: 0 to 9")
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed}: 0 or more")
    cluster = ClusterParams(nodes=args.nodes, gpus=args.gpus, nics=args.nics,
                            nic_speed=flag("nic-speed", parse_speed, args.nic_speed),
                            mgmt_speed=flag("mgmt-speed", parse_speed, args.mgmt_speed),
                            hostname_style=args.hostname_style, port=args.port, job=args.job, gpu_model=args.gpu_model)
    job = JobParams(step_compute=flag("step-time", parse_duration, args.step_time),
                    input_gap=flag("input-gap", parse_duration, args.input_gap),
                    overlap=args.overlap, comm_ratio=args.comm_ratio, gradient_bytes=args.gradient_bytes,
                    transport=args.transport, wait_traffic=args.wait_traffic)
    scrape = ScrapeParams(interval=flag("scrape", parse_duration, args.scrape),
                          jitter=flag("scrape-jitter", parse_duration, args.scrape_jitter),
                          missing=args.missing_scrapes, tick=flag("tick", parse_duration, args.tick))
    command = "gpunet-simulate " + " ".join(shlex.quote(a) for a in argv) if argv is not None else ""
    fabric = FabricParams(ecn=not args.no_ecn, link_layer=args.link_layer)
    return SimSpec(cluster=cluster, job=job, fabric=fabric, scrape=scrape,
                   faults=[flag("fault", lambda x: parse_fault(x, duration), x) for x in args.fault],
                   confounders=[flag("confounder", lambda x: parse_confounder(x, duration), x) for x in args.confounder],
                   config_faults=[flag("config-fault", parse_config_fault, x) for x in args.config_fault],
                   duration=duration, start_time=args.start, seed=args.seed, command=command)


def generate(argv: list[str], verbose: bool = False) -> dict:
    """Run the simulator on CLI-style arguments (the suite uses this): returns the stats."""
    from gpunet.simulate.engine import simulate
    from gpunet.simulate.output import labels_path, write_labels, write_trace

    args = build_parser().parse_args(argv)
    # the recorded command names the output by its file name only, so it is the same wherever it runs
    shown = [a if a != args.out else args.out.rsplit("/", 1)[-1] for a in argv]
    spec = spec_from_args(args, shown)
    for path in (args.out, labels_path(args.out)):  # checked before the work, not after it
        if problem := unwritable(path):
            raise ValueError(f"{path}: {problem}")
    t0 = time.perf_counter()
    result = simulate(spec)
    t1 = time.perf_counter()
    stats = write_trace(result, args.out, compresslevel=args.compress_level)
    labels = write_labels(result, args.out)
    t2 = time.perf_counter()
    stats.update(simulate_s=t1 - t0, write_s=t2 - t1, total_s=t2 - t0, labels=str(labels),
                 incidents=result.labels()["incidents"], idle=result.schedule.idle_fraction(), **result.timings)
    if verbose and not args.quiet:
        print(f"{args.out}: {stats['series']} series, {stats['samples']} samples, "
              f"{stats['bytes'] / 1e6:.1f} MB; simulated in {t1 - t0:.1f} s (steps {result.timings['steps']:.1f} s,"
              f" counters {result.timings['counters']:.1f} s), written in {t2 - t1:.1f} s; "
              f"total {t2 - t0:.1f} s", file=sys.stderr)
        print(f"{labels}: {len(stats['incidents'])} incident(s)", file=sys.stderr)
    return stats


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        generate(argv, verbose=True)
    except ValueError as e:
        print(f"gpunet-simulate: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the output checked before the work; a disk that filled since
        print(f"gpunet-simulate: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
