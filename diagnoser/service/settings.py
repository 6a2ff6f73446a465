"""The settings of `diagnose serve` and `diagnose history`: flags, GPUNET_<FLAG> variables
and a --config YAML file, layered as the exporter's are (gpunet/settings.py). Every value is
checked here, before the service opens its history or binds its port: a bad one is one
line and exit status 2."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path

from diagnoser.analysis.rules import RULES
from gpunet.promapi import add_connection_arguments
from gpunet.settings import layered_defaults, listen_address
from gpunet.window import ArgumentParser, parse_duration, whole

DEFAULT_PORT = 9846  # the exporter's is 9845
DEFAULT_HISTORY = "gpunet-diagnoser.sqlite"
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(b|kb|mb|gb|kib|mib|gib)?\s*$", re.IGNORECASE)
_BYTES = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
MIN_HISTORY_BYTES = 64 << 10  # below this SQLite's own pages leave no room for a report


def duration(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a Prometheus duration (30s, 5m, 14d) from `low` to `high` seconds."""
    def parse(text: str) -> float:
        try:
            value = parse_duration(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: from {low:g}s to {high:g}s")
        return value
    return parse


def size(text: str) -> int:
    """'256MiB', '1GB', '65536' -> bytes, at least MIN_HISTORY_BYTES."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256MiB, 1GB)")
    value = int(float(m.group(1)) * _BYTES[(m.group(2) or "").lower()])
    if value < MIN_HISTORY_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r}: at least {MIN_HISTORY_BYTES // 1024}KiB")
    return value


def http_url(text: str) -> str:
    """An argparse type: an http(s) URL, without its trailing slash."""
    if not re.fullmatch(r"https?://[^\s/?#]+[^\s?#]*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected http(s)://host[/path]")
    return text.rstrip("/")


def add_history_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history", default=DEFAULT_HISTORY, metavar="FILE",
                   help=f"the SQLite file of reports (default {DEFAULT_HISTORY} in the working directory)")


def add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, metavar="YAML",
                   help="settings file whose keys are the flags' names (interval: 60s, history: /var/lib/gpunet/"
                        "diagnoser.sqlite); GPUNET_<FLAG> environment variables override it, flags override both")


def serve_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="diagnose serve", description="Diagnose on a schedule and on Alertmanager's webhook; "
                       "publish verdicts and findings as metrics; keep and serve the reports.")
    p.add_argument("--prometheus", metavar="URL", default=os.environ.get("GPUNET_PROMETHEUS_URL"),
                   help="the Prometheus HTTP API the exporters are scraped into (default $GPUNET_PROMETHEUS_URL)")
    add_connection_arguments(p)
    p.add_argument("--listen", type=listen_address(DEFAULT_PORT), default=("0.0.0.0", DEFAULT_PORT),
                   help=f"address to serve on, [HOST]:PORT (default :{DEFAULT_PORT})")
    p.add_argument("--interval", type=duration(1, 86400), default=60.0, help="between scheduled runs (default 60s)")
    p.add_argument("--lookback", type=duration(60, 7 * 86400), default=1800.0,
                   help="the window of each scheduled run, ending at the run's time (default 30m)")
    p.add_argument("--config-interval", type=duration(10, 86400), default=600.0,
                   help="between reads of the configuration facts (PFC/ECN, MTU, PCIe, bonds) that every run "
                        "audits: they change on maintenance, and at thousands of nodes are most of a run's "
                        "series (default 10m)")
    p.add_argument("--run-timeout", type=duration(1, 86400), default=50.0,
                   help="deadline of one run; a run past it is abandoned (default 50s)")
    p.add_argument("--max-data-age", type=duration(1, 7 * 86400), default=300.0,
                   help="past it a job's verdict and finding series are withdrawn (default 5m)")
    add_history_flag(p)
    p.add_argument("--retention", type=duration(3600, 3650 * 86400), default=14 * 86400.0,
                   help="reports older than this are deleted (default 14d)")
    p.add_argument("--history-max-bytes", type=size, default=256 << 20,
                   help="the oldest reports are deleted while the history is larger (default 256MiB)")
    p.add_argument("--webhook-queue", type=whole(1, 10000), default=16,
                   help="alert-driven diagnoses waiting; past it the webhook answers 429 (default 16)")
    p.add_argument("--external-url", type=http_url, default=None,
                   help="the base of report links in metrics and annotations (default http://<listen>)")
    p.add_argument("--web.config.file", dest="web_config_file", default=None, metavar="FILE",
                   help="TLS and basic auth, in the Prometheus exporter-toolkit format (as the exporter's)")
    p.add_argument("--grafana-url", type=http_url, default=os.environ.get("GPUNET_GRAFANA_URL"),
                   help="your Grafana: findings link to its dashboards; with --grafana-token-file each new finding "
                        "is also posted as an annotation (default $GPUNET_GRAFANA_URL)")
    p.add_argument("--grafana-token-file", default=None, metavar="FILE",
                   help="file holding a Grafana service account token, to post annotations")
    p.add_argument("--recording-rules", choices=("auto", "on", "off"), default="auto",
                   help="read the recorded per-node aggregates (alerts/gpunet.rules.yml) where they exist: auto; "
                        "always: on; never: off (default auto)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    add_config_flag(p)
    return p


def history_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="diagnose history", description="The findings the diagnoser service kept.")
    p.add_argument("--since", type=duration(1, 3650 * 86400), default=7 * 86400.0,
                   help="reports of this last span (default 7d)")
    p.add_argument("--job", metavar="NAME", help="only this job (workload)")
    p.add_argument("--class", dest="cls", choices=sorted(RULES), metavar="CLASS",
                   help="only findings of this class (docs/classes.md)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    add_history_flag(p)
    add_config_flag(p)
    return p


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Flags over GPUNET_* over --config over defaults, then what needs several values."""
    layered_defaults(parser, argv)
    args = parser.parse_args(argv)
    if parser.prog == "diagnose serve":
        if not args.prometheus:
            parser.error("give --prometheus URL (or set GPUNET_PROMETHEUS_URL)")
        if not re.fullmatch(r"https?://[^\s/?#]+[^\s?#]*", args.prometheus):
            parser.error(f"--prometheus {args.prometheus!r}: expected http(s)://host[:port][/path]")
        if args.grafana_token_file and not args.grafana_url:
            parser.error("--grafana-token-file needs --grafana-url")
        for flag, path in (("--grafana-token-file", args.grafana_token_file),
                           ("--bearer-token-file", args.bearer_token_file), ("--ca-file", args.ca_file)):
            if path and not os.access(path, os.R_OK):
                parser.error(f"{flag} {path}: not a readable file")
        if args.external_url is None:
            host, port = args.listen
            args.external_url = f"http://{'localhost' if host in ('0.0.0.0', '::') else host}:{port}"
    if Path(args.history).is_dir():
        parser.error(f"--history {args.history}: a folder: give a file name in it")
    return args
