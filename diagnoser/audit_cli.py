"""`diagnose --audit`: the configuration audit alone. Reads only the configuration series
(a trace's other families are skipped unparsed; from Prometheus, one instant query per
configuration metric) and computes no runtime finding."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Callable

from diagnoser.audit_report import audit_document, audit_text
from diagnoser.config import METRICS
from diagnoser.report import dumps
from diagnoser.sources.promconfig import config_from_prometheus
from diagnoser.sources.replay import TraceError, frame_from_trace
from gpunet.promapi import PromError, client_from_arguments
from gpunet.window import parse_duration, parse_time, resolve


def run_audit(args: argparse.Namespace, progress: Callable[[str], None]) -> int:
    try:
        if args.replay:
            frame = frame_from_trace(args.replay, parse_duration(args.since) if args.since else None,
                                     parse_time(args.start) if args.start else None,
                                     parse_time(args.end) if args.end else None,
                                     warn=lambda m: progress(f"warning: {m}"), wanted=METRICS)
            source, start, end, cfg = frame.source, frame.start, frame.end, frame.config
        else:
            start, end = resolve(args.since, args.start, args.end)

            async def read():
                async with client_from_arguments(args.prometheus, args) as client:
                    return await config_from_prometheus(client, start, end)

            source, cfg = f"prometheus:{args.prometheus}", asyncio.run(read())
    except (TraceError, PromError, ValueError, OSError) as e:
        print(f"diagnose: {e}", file=sys.stderr)
        return 1
    doc = audit_document(source, start, end, cfg)
    print(dumps(doc) if args.format == "json" else audit_text(doc, markdown=args.format == "markdown"), end="")
    return 3 if args.fail_on_findings and doc["configuration"] else 0
