"""The service's metrics (docs/service.md): each job's latest verdict and ongoing findings,
read at scrape time by a custom collector from what the runner last set, and the runs'
own counters. A job whose data is older than --max-data-age loses its verdict and finding
series (its age stays): an alert never fires on a stale verdict shown as current."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from diagnoser.analysis.rules import RULES
from diagnoser.model.report import Finding
from diagnoser.render.evidence import figure, label
from diagnoser.service.history import FindingRow

VERDICTS = ("findings", "healthy", "inconclusive")


@dataclass(frozen=True)
class JobState:
    """What a job's latest diagnosis says, as published."""
    verdict: str
    data_end: float  # the newest time the verdict rests on
    findings: tuple[FindingRow, ...]
    report_id: int | None = None


def _node(instance: str) -> str:
    """'node-017:9845' -> 'node-017': the node as people name it in a page."""
    host, colon, port = instance.rpartition(":")
    return host if colon and port.isdigit() else instance


def _culprit_figure(f: Finding) -> str:
    """The evidence figure that says most about the culprit, in words: the first per-node
    figure of the culprit, else the first plain figure."""
    culprit = f.nodes[0] if f.nodes else None
    for key, value in f.evidence.items():
        if culprit and isinstance(value, dict) and isinstance(value.get(culprit), dict) \
                and isinstance(value[culprit].get("value"), int | float):
            lab = label(key)
            return f"{lab.words} {figure(value[culprit]['value'], lab.unit)}"
    for key, value in f.evidence.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            lab = label(key)
            return f"{lab.words} {figure(value, lab.unit)}"
    return ""


def summary_line(f: Finding) -> str:
    """One line for a page: 'PFC storm from node-017 ens1f0np0, PFC pauses sent 3,400/s,
    2.1 GPU-hours idle so far'."""
    record = RULES.get(f.cls)
    head = record.title if record else f.cls
    if f.nodes:
        more = f" and {len(f.nodes) - 1} more" if len(f.nodes) > 1 else ""
        head += f" from {_node(f.nodes[0])}{' ' + f.devices[0] if f.devices else ''}{more}"
    parts = [head]
    if evidence := _culprit_figure(f):
        parts.append(evidence)
    if f.gpu_idle_seconds is not None:
        parts.append(f"{f.gpu_idle_seconds / 3600:.1f} GPU-hours idle" + (" so far" if f.ongoing else ""))
    return ", ".join(parts)


def finding_row(f: Finding) -> FindingRow:
    return FindingRow(f.cls, f.nodes[0] if f.nodes else "", f.devices[0] if f.devices else "", f.confidence,
                      f.gpu_idle_seconds, f.start, f.end, f.ongoing, summary_line(f))


class Published(Collector):
    """The per-job series, built at each scrape from `states` (set by the runner)."""

    def __init__(self, max_data_age: float, report_url: Callable[[int], str], clock: Callable[[], float] = time.time):
        self.states: dict[str, JobState] = {}
        self.max_data_age, self.report_url, self.clock = max_data_age, report_url, clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        finding_labels = ["workload", "class", "culprit", "device"]
        verdict = GaugeMetricFamily("gpunet_diagnosis_verdict", "1 for the job's current verdict: findings, "
                                    "healthy or inconclusive", labels=["workload", "verdict"])
        finding = GaugeMetricFamily("gpunet_diagnosis_finding", "1 per ongoing finding of the job's current "
                                    "diagnosis", labels=finding_labels)
        confidence = GaugeMetricFamily("gpunet_diagnosis_finding_confidence", "The finding's confidence, 0 to 1",
                                       labels=finding_labels)
        idle = GaugeMetricFamily("gpunet_diagnosis_finding_gpu_idle_seconds", "GPU-seconds of idle the finding "
                                 "caused so far", labels=finding_labels)
        started = GaugeMetricFamily("gpunet_diagnosis_finding_start_timestamp_seconds", "When the finding began",
                                    labels=finding_labels)
        info = GaugeMetricFamily("gpunet_diagnosis_finding_info", "The finding's one-line summary for a page",
                                 labels=[*finding_labels, "summary"])
        age = GaugeMetricFamily("gpunet_diagnosis_data_age_seconds", "Now minus the newest sample the job's "
                                "verdict rests on", labels=["workload"])
        report = GaugeMetricFamily("gpunet_diagnosis_report_info", "The job's newest stored report",
                                   labels=["workload", "report_url"])
        for job, state in sorted(self.states.items()):
            data_age = max(0.0, now - state.data_end)
            age.add_metric([job], data_age)
            if state.report_id is not None:
                report.add_metric([job, self.report_url(state.report_id)], 1)
            if data_age > self.max_data_age:
                continue  # withdrawn: too old to be the current verdict
            verdict.add_metric([job, state.verdict], 1)
            seen: set[tuple[str, str, str]] = set()
            for f in state.findings:
                if not f.ongoing or f.key() in seen:
                    continue
                seen.add(f.key())
                key = [job, *f.key()]
                finding.add_metric(key, 1)
                confidence.add_metric(key, f.confidence)
                idle.add_metric(key, f.gpu_idle_seconds or 0.0)
                started.add_metric(key, f.start)
                info.add_metric([*key, f.summary], 1)
        yield from (verdict, finding, confidence, idle, started, info, age, report)


class Metrics:
    """Every series the service publishes, in a registry of its own."""

    def __init__(self, published: Published, queue_length: Callable[[], float], history_bytes: Callable[[], float],
                 config_age: Callable[[], float] = lambda: float("nan")):
        self.registry = CollectorRegistry(auto_describe=False)
        self.published = published
        self.registry.register(published)
        self.last_success = Gauge("gpunet_diagnosis_last_success_timestamp_seconds",
                                  "When a diagnosis run last succeeded", registry=self.registry)
        self.duration = Histogram("gpunet_diagnosis_run_duration_seconds", "How long diagnosis runs took",
                                  ["trigger"], registry=self.registry,
                                  buckets=(0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 300))
        self.runs = Counter("gpunet_diagnosis_runs", "Diagnosis runs by trigger and result",
                            ["trigger", "result"], registry=self.registry)
        for trigger in ("schedule", "alert"):
            for result in ("ok", "error", "timeout"):
                self.runs.labels(trigger, result)
        self.skipped = Counter("gpunet_diagnosis_runs_skipped", "Scheduled runs skipped because the previous "
                               "one was still going", registry=self.registry)
        self.webhook = Counter("gpunet_diagnosis_webhook_requests", "Alertmanager webhook requests by status code",
                               ["code"], registry=self.registry)
        Gauge("gpunet_diagnosis_queue_length", "Alert-driven diagnoses waiting",
              registry=self.registry).set_function(queue_length)
        Gauge("gpunet_diagnosis_history_bytes", "Bytes of the history file on disk",
              registry=self.registry).set_function(history_bytes)
        Gauge("gpunet_diagnosis_config_age_seconds", "Seconds since the configuration facts the runs audit were "
              "read (--config-interval); NaN before the first read", registry=self.registry).set_function(config_age)
