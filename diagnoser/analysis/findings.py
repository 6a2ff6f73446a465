"""From incidents to what the report holds: typed findings (with their class's title and
remediation), the window's summary, and what the idle cost."""

from __future__ import annotations

import numpy as np

from diagnoser.analysis.calibration import calibrated
from diagnoser.analysis.features import Features
from diagnoser.analysis.rules import rule
from diagnoser.analysis.rules.base import confirm_query
from diagnoser.model.findings import Incident
from diagnoser.model.report import Cost, Finding, Summary, rounded

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


def findings_of(incidents: list[Incident], has_gpus: bool, job: str | None = None,
                judged_until: float = float("inf")) -> list[Finding]:
    """Incidents as findings, with their class's title and remediation (its record); those
    that reach the last window judged (`judged_until`) are still going on."""
    out = []
    for i in incidents:
        record = rule(i.cls)
        out.append(Finding(i.cls, record.title, round(i.start, 3), round(i.end, 3), i.nodes, i.devices,
                           round(calibrated(i.confidence), 2), round(i.gpu_idle_seconds, 1) if has_gpus else None,
                           i.evidence, record.remediation, job, ongoing=i.end >= judged_until - 1e-6,
                           score=i.confidence, promql=confirm_query(record, i.nodes)))
    return out


def summary(features: Features) -> Summary:
    frame = features.frame
    gpus = frame.node["gpus"].groupby(level="instance").max()
    total, idle = _gpu_seconds(features)
    fraction = rounded(idle / total, 4) if total and np.isfinite(total) and total > 0 else None
    judged = None if frame.partial or not len(frame.windows) else \
        (round(float(frame.windows[0]), 3), round(float(frame.windows[-1] + frame.step), 3))
    return Summary(round(frame.start, 3), round(frame.end, 3), len(frame.instances),
                   int(np.nansum(gpus)) if len(gpus) else 0, fraction, judged)


def _gpu_seconds(features: Features) -> tuple[float, float]:
    """(GPU time, GPU idle) in GPU-seconds over the whole range asked for, partial windows at
    its ends included where the source counted them; else over the judged windows."""
    frame = features.frame
    if frame.gpu_seconds is not None and sum(frame.gpu_seconds) > 0:
        return sum(frame.gpu_seconds), frame.gpu_seconds[1]
    g = features.cluster
    return float(g["gpu_time"].sum(min_count=1)), float((g["idle_frac"] * g["gpu_time"]).sum(min_count=1))


def price_findings(findings: list[Finding], price: float | None) -> None:
    """GPU-hours lost to each finding, and with a price per GPU-hour the money."""
    for f in findings:
        if f.gpu_idle_seconds is not None:
            f.gpu_hours_idle = round(f.gpu_idle_seconds / SECONDS_PER_HOUR, 2)
            if price is not None:
                f.cost = round(f.gpu_idle_seconds / SECONDS_PER_HOUR * price, 2)


def cost(features: Features, window: Summary, findings: list[Finding], price: float | None = None,
         currency: str = "") -> Cost | None:
    """The GPU-hours of the window, those idle and those lost to the findings, so that what
    a slow network costs can be set against what an upgrade costs; None without GPU time."""
    gpu_time = _gpu_seconds(features)[0]
    if not np.isfinite(gpu_time) or gpu_time <= 0:
        return None
    idle = gpu_time * (window.gpu_idle_fraction or 0.0)
    lost = min(sum(f.gpu_idle_seconds or 0.0 for f in findings), idle)
    hours = lost / SECONDS_PER_HOUR
    # Per day: only what still goes on at the window's end, at its own rate. An incident that
    # ended cost what it cost; it costs nothing more tomorrow.
    per_day = sum((f.gpu_idle_seconds or 0.0) / max(f.end - f.start, 1.0) for f in findings if f.ongoing) \
        * SECONDS_PER_DAY / SECONDS_PER_HOUR
    out = Cost(round(gpu_time / SECONDS_PER_HOUR, 2), round(idle / SECONDS_PER_HOUR, 2), round(hours, 2),
               round(per_day, 1))
    if price is not None:
        out.gpu_hour_price, out.currency = price, currency
        out.lost, out.lost_per_day = round(hours * price, 2), round(per_day * price, 2)
    return out
