"""The report for people: text for a terminal, markdown for a ticket. Both are written
from the report's structure (diagnoser/model/report.py) into the same blocks
(diagnoser/render/document.py), which are then written out one way or the other."""

from __future__ import annotations

from diagnoser.model.report import FINDINGS, HEALTHY, AuditReport, ConfigFinding, Cost, Finding, JobSummary, Report, Summary
from diagnoser.render.document import Block, Heading, Items, Para, Query, Table, plural, to_markdown, to_text
from diagnoser.render.evidence import evidence_line
from gpunet.window import rfc3339

NOTES_SHOWN = 5  # notes printed under a one-job report
NOTES_SHOWN_JOBS = 8  # ... and under a report of several jobs
CULPRITS_SHOWN = 10
DEVICES_SHOWN = 6
CONFIG_NODES_SHOWN = 4  # nodes named per configuration finding
CONFIG_DEVICES_SHOWN = 4  # devices named per node


def render_text(report: Report, markdown: bool = False) -> str:
    """The whole report: findings worst first (per job, worst job first, where there are
    several), capacity and cost, the configuration audit, notes."""
    return (to_markdown if markdown else to_text)(report_blocks(report))


def render_audit_text(report: AuditReport, markdown: bool = False) -> str:
    blocks: list[Block] = [
        Heading(1, f"gpunet configuration audit of {report.source}"),
        Para(f"window {rfc3339(report.start)} .. {rfc3339(report.end)}, {plural(report.nodes, 'node')}")]
    blocks += configuration_blocks(report.configuration, bool(report.configuration_notes))
    blocks += _notes(report.all_notes(), NOTES_SHOWN_JOBS)
    return (to_markdown if markdown else to_text)(blocks)


def report_blocks(report: Report) -> list[Block]:
    blocks: list[Block] = [Heading(1, f"gpunet diagnosis of {report.source}"), Para(window_words(report.summary))]
    blocks += _verdict(report.verdict, report.inconclusive_reasons, len(report.findings), 2)
    if report.jobs is None:
        blocks += _findings(report.findings, 2, report.cost, report.capacity)
        blocks += _capacity(report.capacity, 2) + _cost(report.cost, 2, "Cost")
    else:
        blocks.append(Heading(2, "Jobs", plural(len(report.jobs), "job") + ", the worst first" if report.jobs
                              else "no job found in the window"))
        if report.jobs:
            blocks.append(jobs_table(report.jobs))
        for job in report.jobs:
            blocks += _job(job, [f for f in report.findings if f.job == job.name])
        blocks += _cost(report.cost, 2, "Cluster cost, all jobs")
    if report.configuration is not None:
        blocks += configuration_blocks(report.configuration, bool(report.configuration_notes))
    blocks += _notes(report.all_notes(), NOTES_SHOWN if report.jobs is None else NOTES_SHOWN_JOBS)
    return blocks


def window_words(s: Summary) -> str:
    judged = ""
    if s.judged is not None and (s.judged[0] - s.start > 1 or s.end - s.judged[1] > 1):
        judged = f" (judged {rfc3339(s.judged[0])[11:]} .. {rfc3339(s.judged[1])[11:]}: whole windows of the grid)"
    return (f"window {rfc3339(s.start)} .. {rfc3339(s.end)}{judged}, {plural(s.nodes, 'node')}, "
            f"{plural(s.gpus, 'GPU')}, GPU idle {pct(s.gpu_idle_fraction)}")


def jobs_table(jobs: list[JobSummary]) -> Table:
    rows = [[j.name, j.found_by, f"{j.summary.nodes:,}", f"{j.summary.gpus:,}", pct(j.summary.gpu_idle_fraction),
             j.verdict, f"{j.findings:,}"] for j in jobs]
    return Table(["job", "found by", "nodes", "GPUs", "GPU idle", "verdict", "findings"], rows, right={2, 3, 4, 6})


def _job(job: JobSummary, findings: list[Finding]) -> list[Block]:
    found = "workload " + job.found_by if job.found_by != "behaviour" else "grouped by behaviour"
    blocks: list[Block] = [Heading(2, f"job {job.name} ({found})"), Para(window_words(job.summary))]
    if job.waited_on and not findings:
        blocks.append(Heading(3, "Verdict", "waited on another job's fault over the shared fabric", tight=True))
    else:
        blocks += _verdict(job.verdict, job.inconclusive_reasons, len(findings), 3)
    waits = []
    for w in job.waited_on:
        culprit = f" (culprit {', '.join(w['nodes'])})" if w["nodes"] else ""
        waits.append(f"waited on job {w['job']}'s {w['class']}{culprit} {rfc3339(w['start'])} .. {rfc3339(w['end'])}: "
                     f"{(w['gpu_idle_seconds'] or 0.0) / 3600:.1f} GPU-hours idle; see that job's finding")
    if waits:
        blocks.append(Items(waits))
    blocks += _findings(findings, 3, job.cost, job.capacity)
    return blocks + _capacity(job.capacity, 3) + _cost(job.cost, 3, "Cost")


def _verdict(verdict: str, reasons: list[str], findings: int, level: int) -> list[Block]:
    """The verdict first: what on-call needs before any detail."""
    if verdict == FINDINGS:
        return [Heading(level, "Verdict", plural(findings, "finding"), tight=True)]
    if verdict == HEALTHY:
        return [Heading(level, "Verdict", "healthy: no bottleneck found, and the window held the GPU and NIC series "
                                          "a verdict needs.", tight=True)]
    return [Heading(level, "Verdict", "inconclusive: no verdict can honestly be given", tight=True),
            Items(list(reasons))]


def _findings(findings: list[Finding], level: int, cost: Cost | None, capacity: dict | None) -> list[Block]:
    blocks: list[Block] = []
    for n, f in enumerate(findings, 1):
        blocks += finding_blocks(f, n, level, cost.currency if cost else "", capacity)
    return blocks


def _victims(victims: list[dict]) -> str:
    return ", ".join(f"{v['job']} ({(v['gpu_idle_seconds'] or 0.0) / 3600:.1f} GPU-hours idle)" for v in victims)


def impact(f: Finding, currency: str = "") -> str:
    """What the finding cost, in GPU-hours idle (and money, with a price)."""
    if f.gpu_idle_seconds is not None:
        out = f"{f.gpu_idle_seconds / 3600:.1f} GPU-hours idle"
    elif f.victims:  # a source without GPUs (a storage node): what it cost is the other jobs' idle
        out = (f"{sum(v['gpu_idle_seconds'] or 0.0 for v in f.victims) / 3600:.1f} GPU-hours idle in the jobs "
               "that waited on it")
    elif "nccl_bus_bandwidth" in f.evidence:
        out = "GPU impact not measured (NCCL figures only)"
    else:
        out = "GPU impact unknown (no GPU series)"
    if f.cost is not None:
        out += f" (= {_money(f.cost, currency)})"
    return out


def span_words(f: Finding) -> str:
    minutes = (f.end - f.start) / 60
    return f"{rfc3339(f.start)} .. {rfc3339(f.end)} ({minutes:.0f} min{', still going on' if f.ongoing else ''})"


def evidence_lines(f: Finding, capacity: dict | None) -> list[str]:
    """Each evidence figure with its label and unit; `link_sizing` points to the capacity
    section (`capacity`), the one place a report sizes the links."""
    return [f"link sizing: {sizing(capacity)}" if key == "link_sizing" and value == "capacity"
            else evidence_line(key, value) for key, value in f.evidence.items()]


def sizing(capacity: dict | None) -> str:
    """The capacity section's answer, as a finding that points to it says it."""
    where = "the capacity section below, the one sizing of this report (over the whole window)"
    if not capacity:
        return "none: no GPU time or fabric speed to size the links from"
    if capacity.get("upgrade_to"):
        maybe = f" ({capacity['may_suffice']} may do)" if capacity.get("may_suffice") not in (
            None, capacity["upgrade_to"]) else ""
        return f"{capacity['upgrade_to']}{maybe}, from {where}"
    return f"no upgrade follows over the whole window; see {where}"


def finding_blocks(f: Finding, n: int, level: int = 2, currency: str = "", capacity: dict | None = None) -> list[Block]:
    job = f"job {f.job}: " if f.job is not None else ""
    head = f"{n}. {f.title} ({f.cls}), confidence {f.confidence:.2f}"
    blocks: list[Block] = [Heading(level, head + (f"; other jobs waited on it: {_victims(f.victims)}" if f.victims
                                                  else "")),
                           Para(f"{job}{span_words(f)}, {impact(f, currency)}", detail=True)]
    if f.nodes:
        devices = f" ({', '.join(f.devices[:DEVICES_SHOWN])})" if f.devices else ""
        more = f" and {len(f.nodes) - CULPRITS_SHOWN} more" if len(f.nodes) > CULPRITS_SHOWN else ""
        blocks.append(Para(f"culprits: {', '.join(f.nodes[:CULPRITS_SHOWN])}{more}{devices}", detail=True))
    if f.evidence:
        blocks.append(Items(evidence_lines(f, capacity)))
    blocks.append(Para(f"what to do: {f.remediation}", detail=True))
    if f.promql:
        blocks.append(Query("confirm", " ".join(f.promql.split())))
    if f.grafana_url:
        blocks.append(Query("see", f.grafana_url, link=True))
    return blocks


def _capacity(capacity: dict | None, level: int) -> list[Block]:
    if not capacity:
        return []
    blocks: list[Block] = [Heading(level, "Network capacity", capacity["verdict"])]
    # The arithmetic where it matters: an upgrade is advised, or the user gave a model size.
    if capacity.get("upgrade_to") or "model" in capacity:
        blocks.append(Items(list(capacity["arithmetic"])))
    return blocks


def _cost(cost: Cost | None, level: int, label: str) -> list[Block]:
    if cost is None or cost.gpu_hours <= 0:
        return []
    line = (f"{cost.gpu_hours_idle:,.1f} of {cost.gpu_hours:,.1f} GPU-hours idle; "
            f"{cost.gpu_hours_lost_to_findings:,.1f} lost to the findings above")
    if cost.lost is not None and cost.lost_per_day is not None and cost.gpu_hour_price is not None:
        line += (f" = {_money(cost.lost, cost.currency)} at {_money(cost.gpu_hour_price, cost.currency)} per "
                 f"GPU-hour; {_money(cost.lost_per_day, cost.currency)} a day while what is still going on lasts")
    elif cost.gpu_hours_lost_per_day > 0:
        line += f", {cost.gpu_hours_lost_per_day:,.1f} GPU-hours a day while what is still going on lasts"
    elif cost.gpu_hours_lost_to_findings > 0:
        line += "; nothing found still goes on at the window's end"
    return [Heading(level, label, line)]


def configuration_blocks(found: list[ConfigFinding], unknowns: bool) -> list[Block]:
    """The "Configuration" section: counts and the first few nodes, readable on one screen
    for hundreds of nodes."""
    blocks: list[Block] = [Heading(2, "Configuration" + (f" ({plural(len(found), 'finding')})" if found else ""))]
    if not found:
        blocks.append(Para("No configuration finding in what is known (see the notes)." if unknowns
                           else "No configuration finding."))
    for n, f in enumerate(found, 1):
        devices = sum(len(d) for d in f.devices.values())
        blocks += [Heading(3, f"C{n}. [{f.severity}] {f.title} ({f.check}): "
                              f"{plural(len(f.nodes), 'node')}, {plural(devices, 'device')}"),
                   Para(_config_nodes(f), detail=True), Para(f"seen: {f.detail}", detail=True),
                   Para(f"why: {f.why}", detail=True), Para(f"fix: {f.fix}", detail=True)]
    return blocks


def _config_nodes(f: ConfigFinding) -> str:
    shown = []
    for node in f.nodes[:CONFIG_NODES_SHOWN]:
        devs = f.devices[node]
        more = f" +{len(devs) - CONFIG_DEVICES_SHOWN}" if len(devs) > CONFIG_DEVICES_SHOWN else ""
        shown.append(f"{node} ({', '.join(devs[:CONFIG_DEVICES_SHOWN])}{more})")
    rest = len(f.nodes) - CONFIG_NODES_SHOWN
    return ", ".join(shown) + (f" and {plural(rest, 'more node')}" if rest > 0 else "")


def _notes(notes: list[str], shown: int) -> list[Block]:
    if not notes:
        return []
    more = [f"and {plural(len(notes) - shown, 'more note')} in the JSON report"] if len(notes) > shown else []
    return [Heading(2, "Notes"), Items(notes[:shown] + more)]


def _money(amount: float, currency: str) -> str:
    return f"{amount:,.2f}{' ' + currency if currency else ''}"


def pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"
