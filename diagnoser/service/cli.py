"""`diagnose serve` and `diagnose history` (docs/service.md), started by diagnoser/cli.py.
Exit status: 0 stopped by SIGTERM/SIGINT (serve) or printed (history); 1 the history file
or the web config cannot be used, or the port cannot be bound (one line says why); 2 a bad
flag, variable or --config value."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time

from aiohttp import web

from diagnoser.render.document import safe
from diagnoser.service.app import make_app
from diagnoser.service.grafana import Annotations
from diagnoser.service.history import History, HistoryError
from diagnoser.service.publish import Metrics, Published
from diagnoser.service.runner import Runner
from diagnoser.service.settings import history_parser, parse, serve_parser
from exporter.server import Access
from exporter.webconfig import WebConfig, WebConfigError
from gpunet.window import rfc3339

log = logging.getLogger("gpunet.diagnoser")


async def serve(args: argparse.Namespace, history: History, web_config: WebConfig | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def report_url(report_id: int) -> str:
        return f"{args.external_url}/reports/{report_id}"

    runner_ref: list[Runner] = []
    metrics = Metrics(Published(args.max_data_age, report_url),
                      lambda: float(len(runner_ref[0].pending)) if runner_ref else 0.0, lambda: float(history.size()),
                      lambda: runner_ref[0].config_age() if runner_ref else float("nan"))
    annotations = Annotations(args.grafana_url, args.grafana_token_file, report_url) if args.grafana_token_file \
        else None
    runner = Runner(args, history, metrics, annotations)
    runner_ref.append(runner)
    access = Access(web_config)
    app_runner = web.AppRunner(make_app(runner, history, metrics, access), access_log=None, shutdown_timeout=1.0)
    await app_runner.setup()
    host, port = args.listen
    site = web.TCPSite(app_runner, host, port, ssl_context=web_config.context if web_config else None)
    await site.start()
    log.info("diagnose serve: %s://%s:%d, Prometheus %s, a run every %gs over %gs, configuration read every %gs, "
             "history %s", "https" if web_config and web_config.context else "http", host, port, args.prometheus,
             args.interval, args.lookback, args.config_interval, args.history)
    await runner.start()
    await stop.wait()
    log.info("stopping")
    await runner.stop()
    await app_runner.cleanup()
    access.close()


def serve_main(argv: list[str]) -> int:
    args = parse(serve_parser(), argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        web_config = WebConfig.load(args.web_config_file) if args.web_config_file else None
    except WebConfigError as e:
        print(f"diagnose serve: --web.config.file {e}", file=sys.stderr)
        return 1
    try:
        history = History(args.history)
    except HistoryError as e:
        print(f"diagnose serve: --history {e}", file=sys.stderr)
        return 1
    try:
        asyncio.run(serve(args, history, web_config))
    except OSError as e:  # the port is taken, or not ours to bind
        print(f"diagnose serve: --listen {args.listen[0]}:{args.listen[1]}: {e.strerror or e}", file=sys.stderr)
        return 1
    finally:
        history.close()
    return 0


def history_main(argv: list[str]) -> int:
    args = parse(history_parser(), argv)
    try:
        history = History(args.history, readonly=True)
        entries = history.entries(job=args.job, cls=args.cls, since=time.time() - args.since, limit=1_000_000)
    except HistoryError as e:
        print(f"diagnose history: --history {e}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps([entry.to_dict() for entry in entries], indent=1))
        return 0
    for entry in entries:
        findings = [f for f in entry.findings if args.cls is None or f.cls == args.cls]
        print(f"{rfc3339(entry.created)}  report {entry.id}  {safe(entry.job)}  {entry.trigger}  {entry.verdict}"
              + ("" if findings else "  (no findings)"))
        for f in findings:
            print(f"    {f.cls}  {safe(f.culprit) or '-'}  {safe(f.device) or '-'}  confidence {f.confidence:.2f}"
                  f"{'  ongoing' if f.ongoing else ''}  {safe(f.summary)}")
    if not entries:
        print(f"no reports in the last {args.since:g}s" + (f" of job {safe(args.job)}" if args.job else ""),
              file=sys.stderr)
    return 0
