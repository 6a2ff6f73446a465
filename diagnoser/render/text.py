"""The report for people: text for a terminal, markdown for a ticket. Both are written
from the report's structure (diagnoser/model/report.py), never from each other."""

from __future__ import annotations

import re

from diagnoser.model.report import FINDINGS, HEALTHY, AuditReport, ConfigFinding, Cost, Finding, JobSummary, Report, Summary
from gpunet.window import rfc3339

NOTES_SHOWN = 5  # notes printed under a one-job report
NOTES_SHOWN_JOBS = 8  # ... and under a report of several jobs
CULPRITS_SHOWN = 10
DEVICES_SHOWN = 6
EVIDENCE_ITEMS_SHOWN = 6  # entries of a per-node evidence figure
CONFIG_NODES_SHOWN = 4  # nodes named per configuration finding
CONFIG_DEVICES_SHOWN = 4  # devices named per node
INDENT = "   "


def render_text(report: Report, markdown: bool = False) -> str:
    """The whole report: findings worst first (per job, worst job first, where there are
    several), capacity and cost, the configuration audit, notes."""
    h1, h2, h3 = ("# ", "## ", "### ") if markdown else ("", "", "")
    lines = [f"{h1}gpunet diagnosis of {report.source}", _window(report.summary)]
    lines += _verdict(report.verdict, report.inconclusive_reasons, len(report.findings), h2)
    if report.jobs is None:
        lines += _findings(report.findings, h2, report.cost)
        lines += _capacity(report.capacity, h2) + _cost(report.cost, h2, "Cost")
    else:
        lines += [f"{len(report.jobs)} job(s): " + ", ".join(j.name for j in report.jobs), ""]
        for job in report.jobs:
            lines += _job(job, [f for f in report.findings if f.job == job.name], h2, h3)
        lines += _cost(report.cost, h2, "Cluster cost, all jobs")
    if report.configuration is not None:
        lines += configuration_lines(report.configuration, bool(report.configuration_notes), h2, h3)
    shown = NOTES_SHOWN if report.jobs is None else NOTES_SHOWN_JOBS
    lines += [f"note: {note}" for note in report.all_notes()[:shown]]
    return _finish(lines, markdown)


def render_audit_text(report: AuditReport, markdown: bool = False) -> str:
    h1, h2, h3 = ("# ", "## ", "### ") if markdown else ("", "", "")
    lines = [f"{h1}gpunet configuration audit of {report.source}",
             f"window {rfc3339(report.start)} .. {rfc3339(report.end)}, {report.nodes} nodes", ""]
    lines += configuration_lines(report.configuration, bool(report.configuration_notes), h2, h3)
    lines += [f"note: {note}" for note in report.all_notes()[:NOTES_SHOWN_JOBS]]
    return _finish(lines, markdown)


# Control characters (C0 but tab, DEL, C1: ANSI escapes among them) in what the data names
# (instances, devices, notes) would drive the reader's terminal: shown escaped instead.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def safe(text: str, markdown: bool = False) -> str:
    """A line of the report as it may be printed: control characters escaped; in markdown,
    HTML tags neutralised (a label value `<script>` stays text in a rendered ticket)."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text.replace("&", "&amp;").replace("<", "&lt;") if markdown else text


def _finish(lines: list[str], markdown: bool) -> str:
    lines = [safe(line, markdown) for line in lines]
    if markdown:  # bullets and paragraphs instead of the terminal's indentation
        lines = [line[len(INDENT):] if line.startswith(INDENT + "- ") else
                 ("\n" + line[len(INDENT):] if line.startswith(INDENT) else line) for line in lines]
    return "\n".join(lines).rstrip() + "\n"


def _window(s: Summary) -> str:
    judged = ""
    if s.judged is not None and (s.judged[0] - s.start > 1 or s.end - s.judged[1] > 1):
        judged = f" (judged {rfc3339(s.judged[0])[11:]} .. {rfc3339(s.judged[1])[11:]}: whole windows of the grid)"
    return (f"window {rfc3339(s.start)} .. {rfc3339(s.end)}{judged}, {s.nodes} nodes, {s.gpus} GPUs, "
            f"GPU idle {_pct(s.gpu_idle_fraction)}")


def _job(job: JobSummary, findings: list[Finding], h2: str, h3: str) -> list[str]:
    found = "workload " + job.found_by if job.found_by != "behaviour" else "grouped by behaviour"
    lines = [f"{h2}job {job.name} ({found})", _window(job.summary)]
    if job.waited_on and not findings:
        lines += [f"{h3}Verdict: waited on another job's fault over the shared fabric", ""]
    else:
        lines += _verdict(job.verdict, job.inconclusive_reasons, len(findings), h3)
    for w in job.waited_on:
        culprit = f" (culprit {', '.join(w['nodes'])})" if w["nodes"] else ""
        lines += [f"{INDENT}- waited on job {w['job']}'s {w['class']}{culprit} {rfc3339(w['start'])} .. "
                  f"{rfc3339(w['end'])}: {(w['gpu_idle_seconds'] or 0.0) / 3600:.1f} GPU-hours idle; see that job's "
                  "finding", ""]
    lines += _findings(findings, h3, job.cost)
    lines += _capacity(job.capacity, h3) + _cost(job.cost, h3, "Cost")
    while lines[-1] == "":
        lines.pop()
    return lines + [""]


def _verdict(verdict: str, reasons: list[str], findings: int, h: str) -> list[str]:
    """The verdict first: what on-call needs before any detail."""
    if verdict == FINDINGS:
        return [f"{h}Verdict: {_count(findings, 'finding')}", ""]
    if verdict == HEALTHY:
        return [f"{h}Verdict: healthy: no bottleneck found, and the window held the GPU and NIC series a "
                "verdict needs.", ""]
    return [f"{h}Verdict: inconclusive: no verdict can honestly be given", *(f"{INDENT}- {r}" for r in reasons), ""]


def _findings(findings: list[Finding], h: str, cost: Cost | None) -> list[str]:
    lines: list[str] = []
    for n, f in enumerate(findings, 1):
        lines += finding_lines(f, n, h, cost.currency if cost else "")
    return lines


def _victims(victims: list[dict]) -> str:
    return ", ".join(f"{v['job']} ({(v['gpu_idle_seconds'] or 0.0) / 3600:.1f} GPU-hours idle)" for v in victims)


def finding_lines(f: Finding, n: int, h: str = "", currency: str = "") -> list[str]:
    minutes = (f.end - f.start) / 60
    if f.gpu_idle_seconds is not None:
        impact = f"{f.gpu_idle_seconds / 3600:.1f} GPU-hours idle"
    elif f.victims:  # a source without GPUs (a storage node): what it cost is the other jobs' idle
        impact = (f"{sum(v['gpu_idle_seconds'] or 0.0 for v in f.victims) / 3600:.1f} GPU-hours idle in the jobs "
                  "that waited on it")
    elif "nccl_bus_bandwidth" in f.evidence:
        impact = "GPU impact not measured (NCCL figures only)"
    else:
        impact = "GPU impact unknown (no GPU series)"
    if f.cost is not None:
        impact += f" (= {_money(f.cost, currency)})"
    lines = [f"{h}{n}. {f.title} ({f.cls}), confidence {f.confidence:.2f}"
             + (f"; other jobs waited on it: {_victims(f.victims)}" if f.victims else ""),
             f"{INDENT}{rfc3339(f.start)} .. {rfc3339(f.end)} ({minutes:.0f} min"
             f"{', still going on' if f.ongoing else ''}), {impact}"]
    if f.nodes:
        devices = f" ({', '.join(f.devices[:DEVICES_SHOWN])})" if f.devices else ""
        lines.append(f"{INDENT}culprits: {', '.join(f.nodes[:CULPRITS_SHOWN])}{devices}")
    lines += [f"{INDENT}- {key.replace('_', ' ')}: {figure(value, is_share(key))}" for key, value in f.evidence.items()]
    lines.append(f"{INDENT}what to do: {f.remediation}")
    if f.promql:
        lines.append(f"{INDENT}confirm: {' '.join(f.promql.split())}")
    if f.grafana_url:
        lines.append(f"{INDENT}see: {f.grafana_url}")
    return lines + [""]


def _capacity(capacity: dict | None, h: str) -> list[str]:
    if not capacity:
        return []
    lines = [f"{h}Network capacity: {capacity['verdict']}"]
    # The arithmetic where it matters: an upgrade is advised, or the user gave a model size.
    if capacity.get("upgrade_to") or "model" in capacity:
        lines += [f"{INDENT}- {step}" for step in capacity["arithmetic"]]
    return lines + [""]


def _cost(cost: Cost | None, h: str, label: str) -> list[str]:
    if cost is None or cost.gpu_hours <= 0:
        return []
    line = (f"{h}{label}: {cost.gpu_hours_idle:,.1f} of {cost.gpu_hours:,.1f} GPU-hours idle; "
            f"{cost.gpu_hours_lost_to_findings:,.1f} lost to the findings above")
    if cost.lost is not None and cost.lost_per_day is not None and cost.gpu_hour_price is not None:
        line += (f" = {_money(cost.lost, cost.currency)} at {_money(cost.gpu_hour_price, cost.currency)} per "
                 f"GPU-hour; {_money(cost.lost_per_day, cost.currency)} a day while what is still going on lasts")
    elif cost.gpu_hours_lost_per_day > 0:
        line += f", {cost.gpu_hours_lost_per_day:,.1f} GPU-hours a day while what is still going on lasts"
    elif cost.gpu_hours_lost_to_findings > 0:
        line += "; nothing found still goes on at the window's end"
    return [line, ""]


def configuration_lines(found: list[ConfigFinding], unknowns: bool, h2: str = "", h3: str = "") -> list[str]:
    """The "Configuration" section: counts and the first few nodes, readable on one screen
    for hundreds of nodes."""
    lines = [f"{h2}Configuration" + (f" ({len(found)} findings)" if found else "")]
    if not found:
        lines.append("No configuration finding in what is known (see the notes)." if unknowns
                     else "No configuration finding.")
    for n, f in enumerate(found, 1):
        devices = sum(len(d) for d in f.devices.values())
        lines.append(f"{h3}C{n}. [{f.severity}] {f.title} ({f.check}): "
                     f"{_count(len(f.nodes), 'node')}, {_count(devices, 'device')}")
        lines.append(f"{INDENT}{_config_nodes(f)}")
        lines.append(f"{INDENT}seen: {f.detail}")
        lines.append(f"{INDENT}why: {f.why}")
        lines.append(f"{INDENT}fix: {f.fix}")
    return lines + [""]


def _config_nodes(f: ConfigFinding) -> str:
    shown = []
    for node in f.nodes[:CONFIG_NODES_SHOWN]:
        devs = f.devices[node]
        more = f" +{len(devs) - CONFIG_DEVICES_SHOWN}" if len(devs) > CONFIG_DEVICES_SHOWN else ""
        shown.append(f"{node} ({', '.join(devs[:CONFIG_DEVICES_SHOWN])}{more})")
    rest = len(f.nodes) - CONFIG_NODES_SHOWN
    return ", ".join(shown) + (f" and {rest} more nodes" if rest > 0 else "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _money(amount: float, currency: str) -> str:
    return f"{amount:,.2f}{' ' + currency if currency else ''}"


def is_share(key: str) -> bool:
    """Evidence that is a share of time (GPU idle, a link's utilisation, time saturated or
    throttled): the JSON keeps the fraction, people read a percentage, as everywhere else."""
    return "gpu_idle" in key or key.endswith(("utilisation", "_fraction", "saturated_time"))


def figure(value: object, share: bool = False) -> str:
    if isinstance(value, float) and share:
        return _pct(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, dict) and {"count", "expected"} <= value.keys():  # a culprit's events as a count
        expected, ratio, p = value["expected"], value.get("ratio"), value.get("p_value")
        if not isinstance(expected, float):
            return f"{figure(value['count'])} (no peers to compare)"
        times = f", {figure(ratio)}x" if isinstance(ratio, float) else ""
        chance = f", p {'< 1e-12' if p < 1e-12 else f'= {p:.2g}'}" if isinstance(p, float) else ""
        return f"{figure(value['count'])} (its peers' rate predicts {figure(expected)}{times}{chance})"
    if isinstance(value, dict) and {"value", "peers_median"} <= value.keys():  # a culprit against its peers
        ratio = value.get("ratio")
        times = f", {figure(ratio)}x" if isinstance(ratio, float) else ""
        return f"{figure(value['value'], share)} (peers' median {figure(value['peers_median'], share)}{times})"
    if isinstance(value, dict):
        return ", ".join(f"{k} {figure(v, share)}" for k, v in list(value.items())[:EVIDENCE_ITEMS_SHOWN])
    return str(value)


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"
