"""The diagnosis, start to end: source -> frame -> jobs -> features -> classification ->
incidents -> findings -> report. `diagnose()` is what the `diagnose` command runs, and what
the benchmarks and tests call; it returns the report as data, for a renderer to print.

A cluster of one job found by behaviour gets one diagnosis of the whole frame; otherwise
each job (a workload, or a group of unattributed nodes) is diagnosed on its own frame and
its findings are reported under its name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from urllib.parse import urlencode

import pandas as pd

from diagnoser.analysis import charts
from diagnoser.analysis.audit import audit as audit_configuration
from diagnoser.analysis.audit import cross_reference
from diagnoser.analysis.capacity import ModelSize, advise
from diagnoser.analysis.classify import baseline, classify, fabric_level
from diagnoser.analysis.crossjob import attribute
from diagnoser.analysis.features import Features, compute
from diagnoser.analysis.findings import cost, findings_of, price_findings, summary
from diagnoser.analysis.incidents import incidents_of
from diagnoser.analysis.jobs import Job, split, subset
from diagnoser.analysis.nccl import annotate
from diagnoser.analysis.phases import Change, phase_notes, phase_windows, phases_of
from diagnoser.analysis.rules import rule
from diagnoser.analysis.verdict import (
    missing_data,
    too_few_peers,
    unexplained_idle,
    unplaced_series,
    verdict,
)
from diagnoser.model.frame import Frame
from diagnoser.model.netconfig import ConfigSnapshot
from diagnoser.model.report import HEALTHY, AuditReport, Finding, JobSummary, Report
from diagnoser.sources import Progress, Source, quiet, read_config, read_frame, read_nccl

MAX_WARNINGS = 20  # of the source's warnings, carried in the report's notes


class UnknownJob(Exception):
    """--job names no job of the window; str() lists the jobs there are."""


@dataclass(frozen=True)
class Options:
    job: str | None = None  # diagnose only this job
    model: ModelSize | None = None  # for the capacity section's all-reduce arithmetic
    gpu_hour_price: float | None = None
    currency: str = ""
    charts: bool = False  # carry the series the HTML report draws
    grafana_url: str | None = None  # link each finding to the dashboard that shows it


@dataclass
class _Diagnosis:
    """One job's (or the whole frame's) analysis, before it is put in the report."""
    features: Features
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    verdict: str = HEALTHY
    reasons: list[str] = field(default_factory=list)  # why no verdict could be given


def diagnose(source: Source, options: Options = Options(), progress: Progress = quiet,
             config: ConfigSnapshot | None = None) -> Report:
    """Read the source and diagnose its window. Raises SourceError, UnknownJob. `config`: a
    configuration snapshot already read (the service reads it on a slower schedule of its
    own), audited instead of the source's configuration facts, which are then not read."""
    frame = read_frame(source, progress, config)
    return diagnose_frame(frame, options, read_nccl(source))


def audit(source: Source, progress: Progress = quiet) -> AuditReport:
    """Only the configuration audit of the source's window (fast: no runtime series)."""
    name, start, end, cfg = read_config(source, progress)
    configuration, notes = audit_configuration(cfg)
    nodes = set(cfg.nic.index.get_level_values("instance")) | set(cfg.gpu.index.get_level_values("instance"))
    return AuditReport(name, round(start, 3), round(end, 3), len(nodes), configuration, notes)


def diagnose_frame(frame: Frame, options: Options = Options(), nccl: pd.DataFrame | None = None) -> Report:
    """Diagnose a frame already read, job by job where it holds several."""
    jobs = split(frame)
    if len(jobs) == 1 and jobs[0].how == "behaviour" and not options.job:
        report, per_job = _whole(frame, options)
    else:
        if options.job:
            names = [j.name for j in jobs]
            if options.job not in names:
                raise UnknownJob(f"no job {options.job!r} in this window; jobs found: {', '.join(names) or 'none'}")
        report, per_job = _by_job(frame, jobs, options)
    records = frame.nccl if nccl is None or not len(nccl) else (
        pd.concat([nccl, frame.nccl], ignore_index=True) if len(frame.nccl) else nccl)
    if len(records):
        job_of = {i: j.name for j in report.jobs or [] for i in j.instances}
        annotate(report.findings, report.notes, records, frame.instances, frame.start, frame.end, job_of)
    configuration, notes = audit_configuration(frame.config)
    report.configuration, report.configuration_notes = configuration, notes
    cross_reference(report.findings, configuration)
    if options.job:
        _only(report, options.job)
    if options.charts:
        _add_charts(report, per_job)
    if options.grafana_url:
        for f in report.findings:
            f.grafana_url = grafana_link(options.grafana_url, f)
    return report


# The committed dashboards' uids (dashboards/build.py) and the margin shown around a finding.
NODE_DASHBOARD, CLUSTER_DASHBOARD = "gpunet-node", "gpunet-cluster"
LINK_MARGIN_S = 300


def grafana_link(base: str, finding: Finding) -> str:
    """The dashboard, nodes and span that show a finding: the node drill-down for one that
    names nodes, the cluster overview for one that does not (a fabric-wide congestion)."""
    params = [("from", str(int((finding.start - LINK_MARGIN_S) * 1000))),
              ("to", str(int((finding.end + LINK_MARGIN_S) * 1000)))]
    uid = NODE_DASHBOARD if finding.nodes else CLUSTER_DASHBOARD
    params += [("var-instance", node) for node in finding.nodes]
    return f"{base.rstrip('/')}/d/{uid}?{urlencode(params)}"


def analyse(frame: Frame, changes: list[Change] | None = None,
            fabric: tuple[float, float] = (float("nan"), float("nan")), ended: bool = False) -> _Diagnosis:
    """features -> classification -> incidents -> findings -> verdict, on one job's frame.
    A range without one whole window is not classified at all; one too short to compare
    windows is, for the classes with a signature of their own (a storm's pause rate needs
    no baseline), but says so in its verdict where nothing is found. `changes`: where the
    job started or its nodes changed inside the range (its phases are judged apart);
    `fabric`: the other jobs' congestion signal (classify.fabric_level); `ended`: the job
    ended inside the range (what lasted to its end is over, not still going on)."""
    features = compute(frame)
    job_phases = phases_of(features, changes or [])
    phase = frozenset(phase_windows(job_phases, features))
    base = baseline(features, phase, fabric)
    held = classify(features, base, phase) if not frame.partial else []
    incidents, notes = incidents_of(held, frame.step)
    notes = phase_notes(job_phases) + notes
    findings = findings_of(incidents, frame.has_gpus,
                           judged_until=float("inf") if ended else float(frame.windows[-1] + frame.step))
    reasons = missing_data(frame, features)
    if not findings:
        reasons += unexplained_idle(features, {w.window for w in held} | phase, base.idle_frac)
    elif reasons:  # findings stand; what could not be seen goes with them as notes
        notes, reasons = notes + reasons, []
    return _Diagnosis(features, findings, notes + too_few_peers(features), verdict(findings, reasons), reasons)


def _whole(frame: Frame, options: Options) -> tuple[Report, dict[str | None, Features]]:
    d = analyse(frame)
    notes = d.notes + frame.warnings[:MAX_WARNINGS]
    window = summary(d.features)
    report = Report(frame.source, window, d.findings, notes=notes, has_gpus=frame.has_gpus,
                    capacity=advise(d.features, options.model, _other_causes(d.findings)), verdict=d.verdict,
                    inconclusive_reasons=d.reasons)
    if frame.has_gpus:
        price_findings(report.findings, options.gpu_hour_price)
        report.cost = cost(d.features, window, report.findings, options.gpu_hour_price, options.currency)
    return report, {None: d.features}


def _by_job(frame: Frame, jobs: list[Job], options: Options) -> tuple[Report, dict[str | None, Features]]:
    """Each job's findings on its own frame; the cluster's summary and cost over all."""
    whole = compute(frame)
    per_job: dict[str | None, Features] = {None: whole}
    summaries = []
    findings: list[Finding] = []
    for job in jobs:
        d = analyse(subset(frame, job.instances, job.start, job.end), job.changes,
                    fabric_level(whole, job.instances), ended=job.end < frame.end - frame.step)
        per_job[job.name] = d.features
        window = summary(d.features)
        for f in d.findings:
            f.job = job.name
        entry = JobSummary(job.name, job.how, window, job.instances, len(d.findings),
                           round(sum(f.gpu_idle_seconds or 0.0 for f in d.findings), 1),
                           capacity=advise(d.features, options.model, _other_causes(d.findings)),
                           notes=[*d.notes, *job.notes], verdict=d.verdict, inconclusive_reasons=d.reasons)
        if d.features.frame.has_gpus:
            price_findings(d.findings, options.gpu_hour_price)
            entry.cost = cost(d.features, window, d.findings, options.gpu_hour_price, options.currency)
        summaries.append(entry)
        findings.extend(d.findings)
    findings = attribute(findings, summaries)
    summaries.sort(key=lambda j: (-j.gpu_idle_seconds_in_findings, -(j.summary.gpu_idle_fraction or 0), j.name))
    order = {j.name: k for k, j in enumerate(summaries)}
    findings.sort(key=lambda f: (order[str(f.job)], -(f.gpu_idle_seconds or 0.0)))
    notes = frame.warnings[:MAX_WARNINGS]
    window = summary(whole)
    reasons = unplaced_series(frame) + [f"{j.name}: {r}" for j in summaries for r in j.inconclusive_reasons]
    report = Report(frame.source, window, findings, jobs=summaries, notes=notes, has_gpus=frame.has_gpus,
                    verdict=verdict(findings, reasons), inconclusive_reasons=[] if findings else reasons)
    if frame.has_gpus:
        report.cost = cost(whole, window, findings, options.gpu_hour_price, options.currency)
    return report, per_job


def _other_causes(findings: list[Finding]) -> list[Finding]:
    """Findings whose idle faster links would not give back: every class but those that
    make GPUs wait on links at line rate."""
    return [f for f in findings if rule(f.cls).waits_in != "saturated"]


def job_report(report: Report, name: str) -> Report:
    """The report of one job of `report`, as `--job NAME` gives it (a copy: `report` stays whole)."""
    one = copy.deepcopy(report)
    _only(one, name)
    return one


def _only(report: Report, name: str) -> None:
    """The report of one job (`--job NAME`): its summary, cost, findings and notes (other
    jobs' notes go with their summaries)."""
    report.jobs = [j for j in report.jobs or [] if j.name == name]
    report.summary = report.jobs[0].summary
    report.cost = report.jobs[0].cost
    kept = [(n, f) for n, f in enumerate(report.findings, 1) if f.job == name]
    report.findings = [f for _, f in kept]
    # Charts already drawn (a report cut into jobs after the analysis) follow their findings'
    # new positions; the others' go.
    position = {old: new for new, (old, _) in enumerate(kept, 1)}
    report.culprit_charts = [replace(c, finding=position[c.finding]) for c in report.culprit_charts
                             if c.finding in position]
    report.verdict, report.inconclusive_reasons = report.jobs[0].verdict, report.jobs[0].inconclusive_reasons


def _add_charts(report: Report, per_job: dict[str | None, Features]) -> None:
    """The series the HTML report draws: the cluster's GPU time, and each localised
    finding's culprits against their own job's peers."""
    whole = per_job[None]
    if whole.frame.has_gpus:
        report.gpu_time_chart = charts.gpu_time(whole)
    for position, f in enumerate(report.findings, 1):
        features = per_job.get(f.job) if report.jobs is not None else whole
        if features is not None:
            chart = charts.culprits(features, f, position)
            if chart is not None:
                report.culprit_charts.append(chart)
