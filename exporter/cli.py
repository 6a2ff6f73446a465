"""gpunet-exporter: serve (default), scrape once, or snapshot the node into a fixture folder."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys

from aiohttp import web

from exporter.collector_flags import add_collector_flags, enabled_collectors, unknown_collector
from exporter.connections import Connections, Limits, Listener, default_max_connections
from exporter.inventory import DEFAULT_EXCLUDE, InventoryOptions
from exporter.readers.gpus import GpuSource
from exporter.readers.kubelet import DEFAULT_SOCKET
from exporter.readers.nvml import FixtureGpus, NvmlGpus
from exporter.readers.slurm_jobs import DEFAULT_DIR
from exporter.registry import Registry
from exporter.root import Root
from exporter.sampler import Sampler
from exporter.server import Access, make_app, quiet_server_logs
from exporter.webconfig import WebConfig, WebConfigError
from exporter.workload_options import DEFAULT_POD_PATTERN, WorkloadOptions, compile_pod_pattern
from gpunet import __version__
from gpunet.contract import DEFAULT_PORT

log = logging.getLogger("gpunet.exporter")

# Where a loaded NVIDIA driver shows itself: the control device NVML opens, and its proc entry.
NVIDIA_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia/version")

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


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--listen {text!r}: expected [HOST]:PORT with a port 1-65535, "
                                         f"e.g. :{DEFAULT_PORT}")
    return host.strip("[]") or "0.0.0.0", int(port)


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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1")
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
    p.add_argument("--web.max-requests", dest="web_max_requests", type=positive_int, default=40,
                   help="requests checked and answered at once (bodies still being sent to slow clients not "
                        "counted); more get 503 (default 40)")
    p.add_argument("--web.max-connections", dest="web_max_connections", type=positive_int, default=None,
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


TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def as_bool(value: object) -> bool:
    """A switch from a config file or an environment variable; anything else is a ValueError
    (GPUNET_NO_GPU=maybe is a mistake to report, not a "no")."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in TRUE + FALSE:
        raise ValueError(f"{value!r} is not a switch (true/false, 1/0, yes/no, on/off)")
    return text in TRUE


def regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {e}") from None
    return text


def env_name(flag: str) -> str:
    """--web.config.file -> GPUNET_WEB_CONFIG_FILE"""
    return "GPUNET_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Flags, then GPUNET_* environment variables, then the --config file, then defaults:
    the same names everywhere."""
    parser = build_parser()
    for arg in sys.argv[1:] if argv is None else argv:
        if arg == "--":
            break
        if arg.startswith("--") and (problem := unknown_collector(arg)):
            parser.error(problem)
    first, _ = parser.parse_known_args(argv)
    settings: dict[str, object] = {}
    config_path = first.config or os.environ.get("GPUNET_CONFIG")
    if config_path:
        import yaml  # only with a settings file: an exporter without one does not load it

        try:
            loaded = yaml.safe_load(open(config_path, encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            parser.error(f"--config {config_path}: {e}")
        if not isinstance(loaded, dict):
            parser.error(f"--config {config_path}: expected a mapping of flag names to values")
        settings.update({str(k): v for k, v in loaded.items()})
    by_flag = {opt.lstrip("-"): action for action in parser._actions for opt in action.option_strings
               if opt.startswith("--")}
    for flag, action in by_flag.items():
        if env_name(flag) in os.environ:
            value = os.environ[env_name(flag)]
            settings[flag] = value.split(",") if isinstance(action, argparse._AppendAction) else value
    defaults = {}
    for key, value in settings.items():
        action = by_flag.get(key)
        if action is None and (problem := unknown_collector(key)):
            parser.error(f"setting {problem} (in --config or GPUNET_* variables)")
        if action is None or key in ("config", "help", "version"):
            parser.error(f"unknown setting {key!r} (in --config or GPUNET_* variables)")
        try:
            if isinstance(action, argparse._StoreTrueAction):
                value = as_bool(value)
            elif isinstance(action, argparse.BooleanOptionalAction):
                value = not as_bool(value) if key.startswith("no-") else as_bool(value)  # no-collector.NAME
            elif isinstance(action, argparse._AppendAction):
                values = value if isinstance(value, list) else [value]
                value = [action.type(str(v)) if action.type else v for v in values]
            elif action.type is not None:
                value = action.type(str(value))
            elif action.choices is not None and value not in action.choices:
                raise ValueError(f"{value!r} is not one of {', '.join(map(str, action.choices))}")
        except (argparse.ArgumentTypeError, ValueError) as e:
            parser.error(f"setting {key} ({env_name(key)} or --config): {e}")
        defaults[action.dest] = value
    parser.set_defaults(**defaults)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        parser.error(f"--root {args.root}: not a folder")
    return args


def make_sampler(args: argparse.Namespace, registry: Registry) -> Sampler:
    fabric = [d for d in args.fabric_devices.split(",") if d] if args.fabric_devices else None
    inventory = InventoryOptions(include=args.nic_include, exclude=args.nic_exclude or None,
                                 link_speeds=dict(args.link_speed), fabric=fabric)
    root = Root(args.root)
    workload = WorkloadOptions(args.workload_kubelet_socket, args.workload_slurm_dir, args.workload_interval,
                               args.workload_pod_pattern)
    return Sampler(root, registry, inventory, args.fast_interval, args.slow_interval, gpu_source(args, root),
                   workload, args.config_interval, enabled_collectors(args))


def gpu_source(args: argparse.Namespace, root: Root) -> GpuSource | None:
    if args.no_gpu:
        return None
    if args.gpu_fixture:
        return GpuSource(FixtureGpus(args.gpu_fixture))
    if root.is_live:
        if not any(os.path.exists(p) for p in NVIDIA_DRIVER_PATHS):
            # A host without the NVIDIA driver has no GPU to read: its GPU collectors are off,
            # as with --no-gpu, rather than failing forever (and alerting as a broken collector).
            log.info("no NVIDIA driver on this host (%s absent): GPU collectors off", " and ".join(NVIDIA_DRIVER_PATHS))
            return None
        return GpuSource(NvmlGpus(root))
    if root.exists("nvml.json"):
        return GpuSource(FixtureGpus(root.path("nvml.json")))
    return None  # a fixture node without GPUs


async def serve(args: argparse.Namespace) -> None:
    web_config = WebConfig.load(args.web_config_file) if args.web_config_file else None
    limits = Limits(args.web_max_connections or default_max_connections(), args.web_header_timeout,
                    args.web_idle_timeout, args.web_write_timeout)
    access = Access(web_config, args.web_max_requests, limits)
    registry = Registry(args.root)
    connections = Connections(limits, registry)
    sampler = make_sampler(args, registry)
    quiet_server_logs(registry)
    runner = web.AppRunner(make_app(registry, sampler, access, connections), access_log=None,
                           keepalive_timeout=limits.idle_timeout, shutdown_timeout=1.0)
    await runner.setup()
    host, port = args.listen
    listener = Listener(host, port, runner, connections)
    await listener.serve(web_config.context if web_config else None)  # listening before the first tick
    await sampler.start()
    log.info("gpunet-exporter %s serving %s://%s:%d/metrics (root %s)", __version__,
             "https" if web_config and web_config.context else "http", host, port, args.root)
    loop = asyncio.get_running_loop()
    reloading: list[asyncio.Task] = []

    async def reload() -> None:
        try:
            fresh = WebConfig.load(args.web_config_file)
        except WebConfigError as e:
            log.error("reload refused, keeping the previous web config: %s", e)
            return
        if (fresh.context is None) != (access.web_config is None or access.web_config.context is None):
            log.error("reload refused, keeping the previous web config: %s: TLS cannot be switched on or off by a "
                      "reload; restart the exporter", args.web_config_file)
            return
        if fresh.context is not None:
            await listener.serve(fresh.context)  # new connections get the freshly built context
        access.web_config = fresh
        # Connections made under the old file (a removed CA, certificate or user) end after
        # their request in progress; scrapers reconnect under the new one.
        connections.close_connections()
        log.info("reloaded %s", args.web_config_file)

    def on_sighup() -> None:
        if args.web_config_file:
            reloading[:] = [loop.create_task(reload())]

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    await stop.wait()
    log.info("stopping")
    # Within 5 s whatever is hung: connections get a second to finish, the sampler two; a
    # read stuck in the kernel stays behind in a daemon thread, which does not hold the exit.
    listener.close()
    await runner.cleanup()
    await sampler.stop(timeout=2.0)
    access.close()


async def scrape_once(args: argparse.Namespace) -> bytes:
    registry = Registry(args.root)
    sampler = make_sampler(args, registry)
    await sampler.start()
    await asyncio.to_thread(sampler.wait_first_ticks, 2 * sampler.slow_timeout)
    await asyncio.sleep(args.duration)
    await sampler.stop()
    return registry.render(openmetrics=args.openmetrics)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.command == "snapshot":
        if not args.out_dir:
            print("gpunet-exporter snapshot: OUT_DIR is required", file=sys.stderr)
            return 2
        from exporter.snapshot import write_snapshot

        root = Root(args.root)
        source = gpu_source(args, root)
        try:
            written = write_snapshot(root, args.out_dir, source.backend if source else None)
        except OSError as e:
            print(f"gpunet-exporter snapshot: cannot write {e.filename or args.out_dir}: {e.strerror or e}",
                  file=sys.stderr)
            return 2
        print(f"wrote {written} files to {args.out_dir}", file=sys.stderr)
        return 0
    if args.command == "scrape":
        sys.stdout.buffer.write(asyncio.run(scrape_once(args)))
        return 0
    try:
        asyncio.run(serve(args))
    except WebConfigError as e:
        log.error("--web.config.file %s", e)
        return 2
    except OSError as e:
        log.error("cannot serve on %s:%d: %s", *args.listen, e.strerror or e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
