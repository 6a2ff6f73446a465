"""The report as data: typed findings, job summaries and the document of `diagnose`.

`Report.to_dict()` is the JSON document (docs/diagnose.md); the renderers (text,
markdown, HTML) read these types and nothing else. The charts the HTML draws travel with
the report as plain series, so rendering reads no analysis internals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from gpunet.window import rfc3339

# The verdicts of docs/diagnose.md.
FINDINGS, HEALTHY, INCONCLUSIVE = "findings", "healthy", "inconclusive"


@dataclass
class Finding:
    """One root cause over one span of time."""
    cls: str  # docs/classes.md class
    title: str  # the class's title, for people
    start: float
    end: float
    nodes: list[str]
    devices: list[str]
    confidence: float
    gpu_idle_seconds: float | None  # None: GPU impact unknown
    evidence: dict[str, object]
    remediation: str
    job: str | None = None
    gpu_hours_idle: float | None = None
    cost: float | None = None  # money, with a price per GPU-hour
    ongoing: bool = False  # it reaches the last window judged: still going on
    score: float = float("nan")  # the rules' own score, before calibration into `confidence`
    # Other jobs on the same fabric that waited on this cause (diagnoser/analysis/crossjob.py).
    victims: list[dict] = field(default_factory=list)
    promql: str = ""  # the query that shows the finding's signal on the named nodes
    grafana_url: str | None = None  # the dashboard, nodes and span that show it (--grafana-url)

    def to_dict(self) -> dict:
        doc: dict = {"job": self.job} if self.job is not None else {}
        doc.update({"class": self.cls, **span(self.start, self.end), "ongoing": self.ongoing,
                    "nodes": self.nodes,
                    "devices": self.devices, "confidence": self.confidence,
                    "gpu_idle_seconds": self.gpu_idle_seconds, "evidence": self.evidence,
                    "remediation": self.remediation})
        if self.gpu_hours_idle is not None:
            doc["gpu_hours_idle"] = self.gpu_hours_idle
        if self.cost is not None:
            doc["cost"] = self.cost
        if self.victims:
            doc["victims"] = self.victims
        if self.promql:
            doc["promql"] = self.promql
        if self.grafana_url:
            doc["grafana_url"] = self.grafana_url
        return doc


@dataclass
class ConfigFinding:
    """One configuration check that failed, over every node and device it failed on."""
    check: str
    severity: str  # high | medium | low
    title: str
    nodes: list[str]
    devices: dict[str, list[str]]  # node -> its devices (NICs, GPUs, bonds) concerned
    detail: str  # what was seen, in one line
    evidence: dict = field(default_factory=dict)
    why: str = ""  # why it matters for training
    fix: str = ""


@dataclass
class Summary:
    """What a window held: nodes, GPUs and how idle they were."""
    start: float
    end: float
    nodes: int
    gpus: int
    gpu_idle_fraction: float | None
    # The whole windows of the grid the rules judged (the partial ones at either end are
    # counted in the GPU time, not judged); None where not one whole window fits.
    judged: tuple[float, float] | None = None


@dataclass
class Cost:
    """GPU-hours over the window, those lost to the findings, and with a price the money."""
    gpu_hours: float
    gpu_hours_idle: float
    gpu_hours_lost_to_findings: float
    gpu_hours_lost_per_day: float  # of the findings still going on at the window's end, at their rate
    gpu_hour_price: float | None = None
    currency: str = ""
    lost: float | None = None
    lost_per_day: float | None = None

    def to_dict(self) -> dict:
        doc: dict = {"gpu_hours": self.gpu_hours, "gpu_hours_idle": self.gpu_hours_idle,
                     "gpu_hours_lost_to_findings": self.gpu_hours_lost_to_findings,
                     "gpu_hours_lost_per_day": self.gpu_hours_lost_per_day}
        if self.gpu_hour_price is not None:
            doc.update(gpu_hour_price=self.gpu_hour_price, currency=self.currency, lost=self.lost,
                       lost_per_day=self.lost_per_day)
        return doc


@dataclass
class JobSummary:
    """One job of the cluster: where it ran, what it found, what it cost."""
    name: str
    found_by: str  # the workload source, or "behaviour"
    summary: Summary
    instances: list[str]
    findings: int
    gpu_idle_seconds_in_findings: float
    capacity: dict | None = None
    cost: Cost | None = None
    notes: list[str] = field(default_factory=list)
    verdict: str = HEALTHY  # of this job: findings | healthy | inconclusive
    inconclusive_reasons: list[str] = field(default_factory=list)
    waited_on: list[dict] = field(default_factory=list)  # other jobs' causes it waited on (shared fabric)

    def to_dict(self) -> dict:
        s = self.summary
        doc: dict = {"name": self.name, "found_by": self.found_by, **span(s.start, s.end),
                     "nodes": s.nodes, "gpus": s.gpus, "gpu_idle_fraction": s.gpu_idle_fraction,
                     "instances": self.instances, "verdict": self.verdict, "findings": self.findings,
                     "gpu_idle_seconds_in_findings": self.gpu_idle_seconds_in_findings}
        if self.inconclusive_reasons:
            doc["inconclusive_reasons"] = self.inconclusive_reasons
        if self.waited_on:
            doc["waited_on"] = self.waited_on
        if self.capacity is not None:
            doc["capacity"] = self.capacity
        if self.cost is not None:
            doc["cost"] = self.cost.to_dict()
        return doc


@dataclass
class GpuTimeChart:
    """Share of the cluster's GPU time busy, and idle in each network state, per window."""
    start: float
    end: float
    times: list[float]  # middle of each window
    layers: dict[str, list[float]]  # "busy", "quiet", "active", "saturated", "paused" -> shares


@dataclass
class CulpritChart:
    """A localised finding's culprits against the median of their peers, in the signal
    that named them."""
    finding: int  # 1-based position of the finding in the report
    title: str
    start: float
    end: float
    times: list[float]
    lines: dict[str, list[float]]  # name -> values; the peers' median first
    shade: tuple[float, float]  # the finding's span


@dataclass
class Report:
    """The document of `diagnose`: the window's summary, the findings (worst first), and
    where the cluster holds several jobs, each job's summary."""
    source: str
    summary: Summary
    findings: list[Finding]
    jobs: list[JobSummary] | None = None  # None: the cluster is one job found by behaviour
    notes: list[str] = field(default_factory=list)  # the cluster's; each job's are in its summary
    configuration: list[ConfigFinding] | None = None
    configuration_notes: list[str] = field(default_factory=list)  # what the audit could not know
    capacity: dict | None = None
    cost: Cost | None = None
    has_gpus: bool = True
    gpu_time_chart: GpuTimeChart | None = None
    culprit_charts: list[CulpritChart] = field(default_factory=list)
    # findings | healthy | inconclusive (docs/diagnose.md); the reasons only with inconclusive
    verdict: str = HEALTHY
    inconclusive_reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        s = self.summary
        doc: dict = {"source": self.source, **span(s.start, s.end), "nodes": s.nodes, "gpus": s.gpus,
                     "gpu_idle_fraction": s.gpu_idle_fraction, "verdict": self.verdict}
        if s.judged is not None:
            doc["judged"] = span(*s.judged)
        if self.inconclusive_reasons:
            doc["inconclusive_reasons"] = self.inconclusive_reasons
        if self.jobs is not None:
            doc["jobs"] = [j.to_dict() for j in self.jobs]
        doc["findings"] = [f.to_dict() for f in self.findings]
        if notes := self.all_notes():
            doc["notes"] = notes
        if self.configuration is not None:
            doc["configuration"] = [asdict(f) for f in self.configuration]
        if self.capacity is not None:
            doc["capacity"] = self.capacity
        if self.cost is not None:
            doc["cost"] = self.cost.to_dict()
        return doc

    def all_notes(self) -> list[str]:
        """Every note as printed: each job's (named), the cluster's, the audit's."""
        return ([f"{j.name}: {n}" for j in self.jobs or [] for n in j.notes] + self.notes
                + [f"configuration: {n}" for n in self.configuration_notes])


def span(start: float, end: float) -> dict:
    """A span as the JSON carries it: Unix seconds, and RFC 3339 beside them for people and tools."""
    return {"start": start, "end": end, "start_rfc3339": rfc3339(start), "end_rfc3339": rfc3339(end)}


def rounded(x: float | None, digits: int) -> float | None:
    """A figure for the report: rounded, None where unknown."""
    return None if x is None or not np.isfinite(x) else round(float(x), digits)


@dataclass
class AuditReport:
    """The document of `diagnose --audit`: the configuration audit alone."""
    source: str
    start: float
    end: float
    nodes: int
    configuration: list[ConfigFinding]
    configuration_notes: list[str] = field(default_factory=list)  # what the audit could not know

    def to_dict(self) -> dict:
        doc: dict = {"source": self.source, "start": self.start, "end": self.end, "nodes": self.nodes,
                     "configuration": [asdict(f) for f in self.configuration]}
        if notes := self.all_notes():
            doc["notes"] = notes
        return doc

    def all_notes(self) -> list[str]:
        return [f"configuration: {n}" for n in self.configuration_notes]
