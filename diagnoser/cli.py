"""diagnose: name the bottleneck of a slowed training job, its culprits and the fix.

    diagnose --replay incident.om.gz                 # a trace; the window ends at its last sample
    diagnose --replay incident.om.gz --since 30m --format json
    diagnose serve --prometheus URL                  # the service: docs/service.md
    diagnose history --since 7d                      # what the service kept
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from diagnoser.analysis.capacity import ModelSize
from diagnoser.model.report import FINDINGS, HEALTHY
from diagnoser.pipeline import Options, UnknownJob, audit, diagnose
from diagnoser.render import FORMATS, render
from diagnoser.render.document import safe
from diagnoser.render.html_report import render_html
from diagnoser.sources import Connection, Source, SourceError
from gpunet.promapi import add_connection_arguments
from gpunet.trace import unwritable
from gpunet.window import ArgumentParser, number, window_problem

EXIT_STATUS = ("exit status: 0 a report was printed; 1 the source could not be read (one line on stderr says what "
               "and where); 2 a bad flag or value, or an unknown --job; with --fail-on-findings, 3 when the verdict "
               "is findings and 4 when it is inconclusive")


def parse_count(text: str) -> float:
    """'10B', '70e9', '7b', '350M' -> a number."""
    units = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (e.g. 10B, 70e9, 350M)") from None


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="diagnose", description=__doc__.split("\n\n")[0], epilog=EXIT_STATUS)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--replay", metavar="FILE", help="a trace (.om or .om.gz, docs/trace-format.md)")
    src.add_argument("--prometheus", metavar="URL", default=os.environ.get("GPUNET_PROMETHEUS_URL"),
                     help="a Prometheus HTTP API: Prometheus, VictoriaMetrics, Thanos, Mimir... "
                          "(default $GPUNET_PROMETHEUS_URL)")
    p.add_argument("--since", help="window length ending at --end (or the trace's last sample), e.g. 1h")
    p.add_argument("--start", help="window start, RFC 3339 or Unix seconds")
    p.add_argument("--end", help="window end, RFC 3339 or Unix seconds")
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("--job", metavar="NAME", help="diagnose only this job (a workload name, or a group "
                   "'unattributed-N' of nodes without workload information); default: every job found")
    p.add_argument("--nccl", action="append", default=[], metavar="FILE",
                   help="NCCL inspector Prometheus dump (NCCL_INSPECTOR_PROM_DUMP: a .prom file or its folder); "
                        "per-rank bus bandwidth as a straggler and link signal. Repeatable")
    add_connection_arguments(p)
    p.add_argument("--recording-rules", choices=("auto", "on", "off"), default="auto",
                   help="read a server's per-node records (alerts/gpunet.rules.yml, group gpunet.diagnoser.records): "
                        "auto where they exist over the window (default), on or fail, off: the raw series")
    p.add_argument("--fail-on-findings", action="store_true",
                   help="exit 3 when the verdict is findings, 4 when it is inconclusive (0: healthy)")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with charts")
    p.add_argument("--grafana-url", metavar="URL", default=os.environ.get("GPUNET_GRAFANA_URL"),
                   help="your Grafana (with gpunet's dashboards imported): each finding links to the dashboard, "
                        "nodes and span that show it (default $GPUNET_GRAFANA_URL)")
    p.add_argument("--audit", action="store_true",
                   help="only the configuration audit (PFC/ECN, NUMA, PCIe, speeds, MTU, bonds); fast")
    cost = p.add_argument_group("capacity and cost")
    # Ranges wide enough for any model and currency; past them the arithmetic would overflow.
    cost.add_argument("--gpu-hour-price", type=number(0, 1e6), metavar="PRICE",
                      help="what one GPU-hour costs: findings then say what their GPU idle cost")
    cost.add_argument("--currency", default="", help="currency of --gpu-hour-price, for the report (e.g. USD)")
    cost.add_argument("--model-params", type=number(1, 1e15, parse=parse_count), metavar="N",
                      help="parameters of the model trained (e.g. 10B, 70e9): shows the all-reduce arithmetic")
    cost.add_argument("--bytes-per-param", type=number(0.125, 16), default=2.0,
                      help="bytes per gradient value (default 2: FP16/BF16)")
    return p


def usage_problem(args: argparse.Namespace) -> str | None:
    """A value that cannot work, found before anything is read (exit 2, not a traceback
    after the whole analysis)."""
    if problem := window_problem(args.since, args.start, args.end, server=not args.replay):
        return problem
    if args.grafana_url and not re.fullmatch(r"https?://[^\s/?#]+[^\s?#]*", args.grafana_url):
        return f"--grafana-url {args.grafana_url}: expected http(s)://host[/path]"
    if args.html and (problem := unwritable(args.html)):
        return f"--html {args.html}: {problem}"
    return None


SUBCOMMANDS = ("serve", "history")  # the service (docs/service.md); any other first word is a flag


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        from diagnoser.service.cli import history_main, serve_main  # loaded only by the service

        return serve_main(argv[1:]) if argv[0] == "serve" else history_main(argv[1:])
    args = build_parser().parse_args(argv)
    if not args.replay and not args.prometheus:
        print("diagnose: give --replay FILE or --prometheus URL (or set GPUNET_PROMETHEUS_URL)", file=sys.stderr)
        return 2
    if problem := usage_problem(args):
        print(f"diagnose: {safe(problem)}", file=sys.stderr)
        return 2
    source = Source(replay=args.replay, prometheus=None if args.replay else args.prometheus, since=args.since,
                    start=args.start, end=args.end, nccl=tuple(args.nccl), recording_rules=args.recording_rules,
                    connection=Connection(args.bearer_token_file, args.basic_auth_user, args.ca_file, args.timeout))
    options = Options(job=args.job, model=ModelSize(args.model_params, args.bytes_per_param) if args.model_params
                      else None, gpu_hour_price=args.gpu_hour_price, currency=args.currency, charts=bool(args.html),
                      grafana_url=args.grafana_url)

    def progress(message: str) -> None:
        print(f"diagnose: {safe(message)}", file=sys.stderr)  # a label value's ESC must not drive the terminal

    try:
        if args.audit:
            checked = audit(source, progress)
            print(render(checked, args.format), end="")
            return 3 if args.fail_on_findings and checked.configuration else 0
        report = diagnose(source, options, progress)
    except SourceError as e:
        progress(str(e))
        return 1
    except UnknownJob as e:
        progress(str(e))
        return 2
    if args.html:
        try:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(render_html(report))
        except OSError as e:  # checked before the analysis; a disk that filled since
            progress(f"--html {args.html}: {e.strerror or e}")
            return 1
    print(render(report, args.format), end="")
    if args.fail_on_findings and report.verdict != HEALTHY:
        return 3 if report.verdict == FINDINGS else 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
