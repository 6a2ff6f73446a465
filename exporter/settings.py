"""The exporter's settings: flags, GPUNET_* environment variables and a --config file, read
into one argparse Namespace. Kept apart from exporter/cli.py, which runs the exporter, so
that the command can read them before it imports the server (exporter/__main__.py)."""

from __future__ import annotations

import argparse
import os
import re
import sys

from exporter.collector_flags import add_collector_flags, unknown_collector
from exporter.inventory import DEFAULT_EXCLUDE
from exporter.readers.kubelet import DEFAULT_SOCKET
from exporter.readers.slurm_jobs import DEFAULT_DIR
from exporter.workload_options import DEFAULT_POD_PATTERN, compile_pod_pattern
from gpunet import __version__
from gpunet.contract import DEFAULT_PORT
from gpunet.settings import layered_defaults, listen_address, unknown_variable
from gpunet.window import whole

_SPEED = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(bit|b|bps)?(/s)?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_speed(text: str) -> float:
    """'200Mbit', '100G', '25Gbit/s' -> bytes per second (link speeds are in bits)."""
    m = _SPEED.match(text)
    if not m or not (m.group(2) or m.group(3)):
        raise argparse.ArgumentTypeError(f"link speed {text!r}: say the unit, e.g. 200Mbit or 100G")
    try:
        value = float(m.group(1)) * _SCALE[m.group(2).lower()] / 8
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"link speed {text!r}: a number above 0 with its unit, e.g. 200Mbit")
    return value


def parse_link_speed(text: str) -> tuple[str, float]:
    device, sep, speed = text.partition("=")
    if not sep or not device:
        raise argparse.ArgumentTypeError(f"--link-speed {text!r}: expected DEVICE=SPEED, e.g. veth0=200Mbit")
    return device, parse_speed(speed)


def pod_pattern(text: str) -> str:
    try:
        compile_pod_pattern(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--workload.pod-pattern {text!r}: {e}") from None
    return text


parse_listen = listen_address(DEFAULT_PORT)


# A tick of 0, a negative one or NaN would busy-loop a core; a day is far beyond any use.
MIN_INTERVAL, MAX_INTERVAL = 0.01, 86400.0


def seconds(text: str) -> float:
    """An interval in seconds: finite, at least MIN_INTERVAL, at most a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not MIN_INTERVAL <= value <= MAX_INTERVAL:  # also false for NaN
        raise argparse.ArgumentTypeError(f"{text!r}: seconds between {MIN_INTERVAL} and {MAX_INTERVAL:.0f}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpunet-exporter",
        description="Sample NIC (and GPU) counters at a fast tick and serve them to Prometheus.")
    p.add_argument("command", nargs="?", default="serve", choices=("serve", "scrape", "snapshot"),
                   help="serve: run the daemon (default); scrape: sample for --duration seconds and print "
                        "one scrape; snapshot: write the node as a fixture folder to OUT_DIR")
    p.add_argument("out_dir", nargs="?", help="folder for 'snapshot'")
    p.add_argument("--listen", type=parse_listen, default=("0.0.0.0", DEFAULT_PORT),
                   help=f"address to serve on, [HOST]:PORT (default :{DEFAULT_PORT})")
    p.add_argument("--root", default="/", help="read the machine through this folder (tests/fixtures/nodes/README.md); "
                   "default /")
    p.add_argument("--fast-interval", type=seconds, default=0.2,
                   help="seconds between fast ticks: wire bytes, pauses, GPU activity (default 0.2)")
    p.add_argument("--config-interval", type=seconds, default=30.0,
                   help="seconds between reads of configuration facts that change rarely: PFC, pause, trust, "
                        "ECN, PCIe links (default 30; at once when the NICs change)")
    p.add_argument("--slow-interval", type=seconds, default=1.0,
                   help="seconds between slow ticks: discovery and all other counters (default 1)")
    p.add_argument("--slow-read", choices=("before-scrape", "every-tick"), default="before-scrape",
                   help="when the slow ticks read what only a scrape shows (all but discovery and the fast-tick "
                        "counters): before-scrape, at the ticks before each scrape is due, once scrapes come at "
                        "a steady rhythm (every tick until then); every-tick: always (default before-scrape)")
    p.add_argument("--link-speed", type=parse_link_speed, action="append", default=[], metavar="DEV=SPEED",
                   help="override a NIC's link speed (e.g. veth0=200Mbit): for virtual interfaces, shaped "
                        "links and drivers that report none; repeatable")
    p.add_argument("--fabric-devices", default=None, metavar="DEV[,DEV...]",
                   help="NICs of the training fabric, which decide network_state (default: those with an "
                        "RDMA device; on a node without any, every NIC with a PCI device)")
    p.add_argument("--nic-include", type=regex, default=None, metavar="REGEX", help="export only NICs matching this")
    p.add_argument("--nic-exclude", type=regex, default=DEFAULT_EXCLUDE, metavar="REGEX",
                   help="do not export NICs matching this (default: loopback and container plumbing)")
    p.add_argument("--gpu-fixture", default=None, metavar="NVML_JSON",
                   help="read GPUs from this nvml.json (tests/fixtures/nodes/README.md) while reading the real network: "
                        "for tests and demos")
    p.add_argument("--no-gpu", action="store_true",
                   help="do not collect GPU metrics (a node without GPUs): turns off every collector that needs "
                        "a GPU, whatever --collector.NAME says")
    p.add_argument("--workload.kubelet-socket", dest="workload_kubelet_socket", default=None, metavar="PATH",
                   help="the kubelet's PodResources socket, to tell which pod uses each GPU (default: "
                        f"{DEFAULT_SOCKET} under --root, skipped when absent; set, its absence is an error)")
    p.add_argument("--workload.slurm-dir", dest="workload_slurm_dir", default=None, metavar="DIR",
                   help="folder a Slurm prolog fills with one file per job and its GPUs (deploy/slurm/; default: "
                        f"{DEFAULT_DIR} under --root, skipped when absent)")
    p.add_argument("--workload.interval", dest="workload_interval", type=seconds, default=10.0, metavar="SECONDS",
                   help="seconds between reads of the workload sources (kubelet, Slurm folder, GPU processes); "
                        "the last answer is served in between (default 10)")
    p.add_argument("--workload.pod-pattern", dest="workload_pod_pattern", type=pod_pattern,
                   default=DEFAULT_POD_PATTERN, metavar="REGEX",
                   help="pod name -> workload: the regex's group (?P<workload>...); the default strips trainer "
                        "roles, ordinals and ReplicaSet/Job suffixes (llama-worker-3 -> llama)")
    p.add_argument("--web.config.file", dest="web_config_file", default=None, metavar="FILE",
                   help="TLS and basic auth, in the Prometheus exporter-toolkit format (node_exporter's); "
                        "SIGHUP reloads it")
    p.add_argument("--web.max-requests", dest="web_max_requests", type=whole(1, 1 << 20), default=40,
                   help="requests checked and answered at once (bodies still being sent to slow clients not "
                        "counted); more get 503 (default 40)")
    p.add_argument("--web.max-connections", dest="web_max_connections", type=whole(1, 1 << 20), default=None,
                   help="open HTTP connections; more are closed as they are accepted (default 256, or half the "
                        "file limit, LimitNOFILE, where that is lower)")
    p.add_argument("--web.header-timeout", dest="web_header_timeout", type=seconds, default=10.0, metavar="SECONDS",
                   help="a request (and a TLS handshake) must arrive whole within this many seconds (default 10)")
    p.add_argument("--web.idle-timeout", dest="web_idle_timeout", type=seconds, default=60.0, metavar="SECONDS",
                   help="close a connection with no request for this many seconds (default 60: keep-alive "
                        "holds across 15 s and 30 s scrapes)")
    p.add_argument("--web.write-timeout", dest="web_write_timeout", type=seconds, default=30.0, metavar="SECONDS",
                   help="cut a response the client has not taken within this many seconds (default 30)")
    p.add_argument("--duration", type=seconds, default=1.0, help="seconds to sample for 'scrape' (default 1)")
    p.add_argument("--openmetrics", action="store_true", help="'scrape' prints OpenMetrics")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--config", default=None, metavar="YAML",
                   help="settings file whose keys are the flags' names (fast-interval: 0.5, link-speed: "
                        "[veth0=200Mbit], web.config.file: /etc/gpunet/web.yml); flags override it, and "
                        "GPUNET_<FLAG> environment variables (GPUNET_FAST_INTERVAL) sit between the two")
    p.add_argument("--version", action="version", version=f"gpunet-exporter {__version__}")
    add_collector_flags(p)
    return p


def regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {e}") from None
    return text


def collector_variable(variable: str, known: list[str]) -> str | None:
    """unknown_variable, and a GPUNET_[NO_]COLLECTOR_* variable naming no collector."""
    if variable.startswith("GPUNET_") and variable not in known:
        m = re.fullmatch(r"GPUNET_(NO_)?COLLECTOR_(.+)", variable, re.IGNORECASE)
        if m and (problem := unknown_collector(f"{'no-' if m.group(1) else ''}collector.{m.group(2).lower()}")):
            return f"environment variable {variable}: {problem.partition(': ')[2]}"
    return unknown_variable(variable, known)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Flags, then GPUNET_* environment variables, then the --config file, then defaults:
    the same names everywhere."""
    parser = build_parser()
    for arg in sys.argv[1:] if argv is None else argv:
        if arg == "--":
            break
        if arg.startswith("--") and (problem := unknown_collector(arg)):
            parser.error(problem)
    layered_defaults(parser, argv, collector_variable, unknown_collector)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        parser.error(f"--root {args.root}: not a folder")
    return args
