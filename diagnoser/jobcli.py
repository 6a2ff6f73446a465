"""`diagnose --job NAME`, one diagnosis per job by default, and `--nccl FILE`: the parts of
the command line that split the cluster into jobs (diagnoser/jobs.py) and read NCCL's own
bandwidth figures (diagnoser/nccl.py)."""

from __future__ import annotations

import argparse
import sys

from diagnoser.audit_report import add_configuration
from diagnoser.capacity import ModelSize
from diagnoser.frame import Frame
from diagnoser.jobs import split
from diagnoser.jobreport import diagnose_jobs, only, to_text_jobs
from diagnoser.nccl import annotate, read_dumps
from diagnoser.report import dumps


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", metavar="NAME", help="diagnose only this job (a workload name, or a group "
                   "'unattributed-N' of nodes without workload information); default: every job found")
    p.add_argument("--nccl", action="append", default=[], metavar="FILE",
                   help="NCCL inspector Prometheus dump (NCCL_INSPECTOR_PROM_DUMP: a .prom file or its folder); "
                        "per-rank bus bandwidth as a straggler and link signal. Repeatable")


def per_job(frame: Frame, args: argparse.Namespace) -> int | None:
    """Diagnose job by job and print; None when the cluster is one job found by behaviour
    alone and no --job was asked: the caller's whole-cluster diagnosis is that job's."""
    try:
        records = args.nccl_records = read_dumps(args.nccl)
    except (OSError, ValueError) as e:
        print(f"diagnose: {e}", file=sys.stderr)
        return 1
    jobs = split(frame)
    if len(jobs) == 1 and jobs[0].how == "behaviour" and not args.job:
        return None
    names = [j.name for j in jobs]
    if args.job and args.job not in names:
        print(f"diagnose: no job {args.job!r} in this window; jobs found: {', '.join(names) or 'none'}",
              file=sys.stderr)
        return 2
    if args.job:
        jobs = [j for j in jobs if j.name == args.job]
    features: dict = {}
    whole, doc = diagnose_jobs(frame, jobs, [], features, model_size(args), args.gpu_hour_price, args.currency)
    nccl_evidence(doc, frame, records)
    add_configuration(doc, frame.config)
    if args.job:
        doc = only(doc, args.job)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(html_page(whole, features, doc))
    print(dumps(doc) if args.format == "json" else to_text_jobs(doc, markdown=args.format == "markdown"), end="")
    return 3 if args.fail_on_findings and doc["findings"] else 0


def model_size(args: argparse.Namespace) -> ModelSize | None:
    return ModelSize(args.model_params, args.bytes_per_param) if args.model_params else None


def nccl_evidence(doc: dict, frame: Frame, records) -> None:
    """NCCL's per-rank bus bandwidth (from --nccl files and from the source) on the findings."""
    import pandas as pd

    extra = getattr(frame, "nccl", None)
    if extra is not None and len(extra):
        records = pd.concat([records, extra], ignore_index=True) if len(records) else extra
    if len(records):
        annotate(doc, records, frame.instances, frame.start, frame.end)


def html_page(whole, features: dict, doc: dict) -> str:
    """The --html page: the cluster's GPU time, each culprit against its own job's peers, the
    report grouped by job."""
    import html

    from diagnoser.html import SIGNAL, culprit_chart, gpu_time_chart, render

    page = render(whole, {**doc, "findings": []})
    if whole.frame.has_gpus:  # the cluster's GPU time, every job's findings shaded
        page = page.replace(gpu_time_chart(whole, []), gpu_time_chart(whole, doc["findings"]))
    charts = "".join(culprit_chart(features[f["job"]], f, i) for i, f in enumerate(doc["findings"], 1)
                     if f["class"] in SIGNAL and f["job"] in features)
    head, report = page.split('<pre id="report">', 1)
    return f'{head}{charts}<pre id="report">{html.escape(to_text_jobs(doc))}</pre>\n</body></html>\n'
