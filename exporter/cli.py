"""gpunet-exporter: serve (default), scrape once, or snapshot the node into a fixture folder.

Run by exporter/__main__.py once the settings are read (exporter/settings.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable

from aiohttp import web

from exporter import gc_settings
from exporter.collector_flags import enabled_collectors
from exporter.connections import Connections, Limits, Listener, default_max_connections
from exporter.inventory import InventoryOptions
from exporter.readers.gpus import GpuSource
from exporter.readers.nvml import FixtureGpus, NvmlGpus
from exporter.registry import Registry
from exporter.root import Root
from exporter.sampler import Sampler
from exporter.server import Access, make_app, quiet_server_logs
from exporter.webconfig import WebConfig, WebConfigError
from exporter.workload_options import WorkloadOptions
from gpunet import __version__

log = logging.getLogger("gpunet.exporter")

# Where a loaded NVIDIA driver shows itself: the control device NVML opens, and its proc entry.
NVIDIA_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia/version")


def make_sampler(args: argparse.Namespace, registry: Registry) -> Sampler:
    fabric = [d for d in args.fabric_devices.split(",") if d] if args.fabric_devices else None
    inventory = InventoryOptions(include=args.nic_include, exclude=args.nic_exclude or None,
                                 link_speeds=dict(args.link_speed), fabric=fabric)
    root = Root(args.root)
    workload = WorkloadOptions(args.workload_kubelet_socket, args.workload_slurm_dir, args.workload_interval,
                               args.workload_pod_pattern)
    return Sampler(root, registry, inventory, args.fast_interval, args.slow_interval, gpu_source(args, root),
                   workload, args.config_interval, enabled_collectors(args),
                   follow_scrapes=args.slow_read == "before-scrape")


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


class ServerSignals:
    """SIGTERM and SIGINT stop the server; SIGHUP reloads the web config. Installed first
    thing in `serve`, before the config is read and the port bound: a config reloader sends
    SIGHUP as soon as the port accepts, and a death by SIGHUP (the default action) is a clean
    exit to systemd, which then leaves the exporter down (Restart=on-failure). A SIGHUP
    before the server is up is logged and applied once it is; reloads run one at a time."""

    def __init__(self, config_file: str | None):
        self.config_file = config_file
        self.stop = asyncio.Event()
        self._reload: Callable[[], Awaitable[None]] | None = None  # set once serving
        self._pending = False
        self._one_at_a_time = asyncio.Lock()
        self._reloads: set[asyncio.Task] = set()  # referenced until done
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.on_sighup)

    def on_sighup(self) -> None:
        if not self.config_file:
            log.info("SIGHUP: there is no --web.config.file to reload")
            return
        if self._reload is None:
            self._pending = True
            log.info("SIGHUP while starting: %s is read again once serving", self.config_file)
            return
        task = asyncio.get_running_loop().create_task(self._reload_in_turn(self._reload))
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    def serving(self, reload: Callable[[], Awaitable[None]]) -> None:
        """The server is up: SIGHUP runs `reload` from now on, and now if one came before."""
        self._reload = reload
        if self._pending:
            self._pending = False
            self.on_sighup()

    async def _reload_in_turn(self, reload: Callable[[], Awaitable[None]]) -> None:
        async with self._one_at_a_time:
            await reload()


async def serve(args: argparse.Namespace) -> None:
    gc_settings.set_thresholds()
    signals = ServerSignals(args.web_config_file)  # before the port is bound
    if getattr(args, "sighup_while_starting", False):  # noted by exporter/__main__.py before this
        log.info("SIGHUP while starting, before %s was read: nothing to reload", args.web_config_file)
    web_config = WebConfig.load(args.web_config_file) if args.web_config_file else None
    limits = Limits(args.web_max_connections or default_max_connections(), args.web_header_timeout,
                    args.web_idle_timeout, args.web_write_timeout)
    access = Access(web_config, args.web_max_requests, limits)
    registry = Registry(args.root)
    connections = Connections(limits, registry)
    sampler = make_sampler(args, registry)
    runner = web.AppRunner(make_app(registry, sampler, access, connections), access_log=None,
                           logger=quiet_server_logs(registry), keepalive_timeout=limits.idle_timeout,
                           shutdown_timeout=1.0)
    await runner.setup()
    host, port = args.listen
    listener = Listener(host, port, runner, connections)
    await listener.serve(web_config.context if web_config else None)  # listening before the first tick
    await sampler.start()
    gc_settings.freeze_what_is_set_up()
    log.info("gpunet-exporter %s serving %s://%s:%d/metrics (root %s)", __version__,
             "https" if web_config and web_config.context else "http", host, port, args.root)

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
        # Connections made under the old file (a removed CA, certificate or user) end: idle
        # ones at once, the others after their request in progress; scrapers reconnect.
        connections.close_connections()
        log.info("reloaded %s", args.web_config_file)

    signals.serving(reload)
    await signals.stop.wait()
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


def run(args: argparse.Namespace) -> int:
    """Run the command the settings name; the exit status."""
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
