"""diagnose: name the bottleneck of a slowed training job, its culprits and the fix.

    diagnose --replay incident.om.gz                 # a trace; the window ends at its last sample
    diagnose --replay incident.om.gz --since 30m --format json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from diagnoser.capacity import advise
from diagnoser.audit_cli import run_audit
from diagnoser.audit_report import add_configuration
from diagnoser.classify import classify
from diagnoser.features import compute
from diagnoser.incidents import absorb_symptoms, merge, periodic_stalls
from diagnoser.jobcli import add_arguments as add_job_arguments, model_size, nccl_evidence, per_job
from diagnoser.report import add_cost, dumps, to_json, to_text
from diagnoser.sources.replay import TraceError, frame_from_trace
from diagnoser.sources.prometheus import frame_from_prometheus
from gpunet.promapi import PromError, add_connection_arguments, client_from_arguments
from gpunet.window import parse_duration, parse_time, resolve


def parse_count(text: str) -> float:
    """'10B', '70e9', '7b', '350M' -> a number."""
    units = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (e.g. 10B, 70e9, 350M)") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="diagnose", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--replay", metavar="FILE", help="a trace (.om or .om.gz, contract section 3)")
    src.add_argument("--prometheus", metavar="URL", default=os.environ.get("GPUNET_PROMETHEUS_URL"),
                     help="a Prometheus HTTP API: Prometheus, VictoriaMetrics, Thanos, Mimir... "
                          "(default $GPUNET_PROMETHEUS_URL)")
    p.add_argument("--since", help="window length ending at --end (or the trace's last sample), e.g. 1h")
    p.add_argument("--start", help="window start, RFC 3339 or Unix seconds")
    p.add_argument("--end", help="window end, RFC 3339 or Unix seconds")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    add_job_arguments(p)
    add_connection_arguments(p)
    p.add_argument("--fail-on-findings", action="store_true", help="exit 3 when something was found")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with charts")
    p.add_argument("--audit", action="store_true",
                   help="only the configuration audit (PFC/ECN, NUMA, PCIe, speeds, MTU, bonds); fast")
    cost = p.add_argument_group("capacity and cost")
    cost.add_argument("--gpu-hour-price", type=float, metavar="PRICE",
                      help="what one GPU-hour costs: findings then say what their GPU idle cost")
    cost.add_argument("--currency", default="", help="currency of --gpu-hour-price, for the report (e.g. USD)")
    cost.add_argument("--model-params", type=parse_count, metavar="N",
                      help="parameters of the model trained (e.g. 10B, 70e9): shows the all-reduce arithmetic")
    cost.add_argument("--bytes-per-param", type=float, default=2.0,
                      help="bytes per gradient value (default 2: FP16/BF16)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.replay and not args.prometheus:
        print("diagnose: give --replay FILE or --prometheus URL (or set GPUNET_PROMETHEUS_URL)", file=sys.stderr)
        return 2
    progress = (lambda m: print(f"diagnose: {m}", file=sys.stderr))
    if args.audit:
        return run_audit(args, progress)
    try:
        if args.replay:
            since = parse_duration(args.since) if args.since else None
            start = parse_time(args.start) if args.start else None
            end = parse_time(args.end) if args.end else None
            frame = frame_from_trace(args.replay, since, start, end, warn=lambda m: progress(f"warning: {m}"))
        else:
            start, end = resolve(args.since, args.start, args.end)

            async def read() -> object:
                async with client_from_arguments(args.prometheus, args) as client:
                    return await frame_from_prometheus(client, start, end, progress)

            frame = asyncio.run(read())
    except (TraceError, PromError, ValueError, OSError) as e:
        print(f"diagnose: {e}", file=sys.stderr)
        return 1
    handled = per_job(frame, args)  # several jobs, or --job: one diagnosis per job
    if handled is not None:
        return handled
    features = compute(frame)
    incidents, stalls = periodic_stalls(
        absorb_symptoms(merge(classify(features), frame.step), frame.step), frame.step)
    notes = []
    if stalls:
        notes.append(f"{len(stalls)} brief, periodic GPU stalls with a quiet network (checkpoints?) were left out")
    if not frame.has_gpus:
        notes.append("no GPU series: network conditions are reported, their GPU impact is unknown")
    doc = to_json(features, incidents, notes)
    nccl_evidence(doc, frame, args.nccl_records)
    add_configuration(doc, frame.config)
    capacity = advise(features, model_size(args))
    if capacity is not None:
        doc["capacity"] = capacity
    add_cost(doc, features, args.gpu_hour_price, args.currency)
    if args.html:
        from diagnoser.html import render

        with open(args.html, "w", encoding="utf-8") as f:
            f.write(render(features, doc))
    print(dumps(doc) if args.format == "json" else to_text(doc, markdown=args.format == "markdown"), end="")
    return 3 if args.fail_on_findings and doc["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
