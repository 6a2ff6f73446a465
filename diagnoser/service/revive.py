"""A stored report's JSON document (render(report, "json")) read back into a Report, so that
the HTML and markdown pages are rendered on demand by the same renderers as `diagnose`'s.
The document carries every figure those pages print; the HTML page's charts are kept beside
it (`charts_document`); the rules' raw scores the pages go without."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from diagnoser.analysis.rules import RULES
from diagnoser.model.report import (
    ConfigFinding,
    Cost,
    CulpritChart,
    Finding,
    GpuTimeChart,
    JobSummary,
    Report,
    Summary,
)


def _summary(doc: dict) -> Summary:
    judged = doc.get("judged")
    return Summary(doc["start"], doc["end"], doc["nodes"], doc["gpus"], doc.get("gpu_idle_fraction"),
                   (judged["start"], judged["end"]) if judged else None)


def _cost(doc: dict | None) -> Cost | None:
    if doc is None:
        return None
    names = {f.name for f in fields(Cost)}
    return Cost(**{k: v for k, v in doc.items() if k in names})


def _finding(doc: dict) -> Finding:
    record = RULES.get(doc["class"])
    return Finding(doc["class"], record.title if record else doc["class"], doc["start"], doc["end"], doc["nodes"],
                   doc["devices"], doc["confidence"], doc.get("gpu_idle_seconds"), doc.get("evidence", {}),
                   doc.get("remediation", ""), job=doc.get("job"), gpu_hours_idle=doc.get("gpu_hours_idle"),
                   cost=doc.get("cost"), ongoing=doc.get("ongoing", False), victims=doc.get("victims", []),
                   promql=doc.get("promql", ""), grafana_url=doc.get("grafana_url"))


def _job(doc: dict) -> JobSummary:
    return JobSummary(doc["name"], doc["found_by"], _summary(doc), doc["instances"], doc["findings"],
                      doc["gpu_idle_seconds_in_findings"], capacity=doc.get("capacity"), cost=_cost(doc.get("cost")),
                      verdict=doc["verdict"], inconclusive_reasons=doc.get("inconclusive_reasons", []),
                      waited_on=doc.get("waited_on", []))


def report_from_dict(doc: dict) -> Report:
    """The Report whose to_dict() gave `doc` (every note in the cluster's notes: the document
    holds them already joined with their job's name)."""
    configuration = doc.get("configuration")
    return Report(doc["source"], _summary(doc), [_finding(f) for f in doc["findings"]],
                  jobs=[_job(j) for j in doc["jobs"]] if "jobs" in doc else None, notes=doc.get("notes", []),
                  configuration=[ConfigFinding(**c) for c in configuration] if configuration is not None else None,
                  capacity=doc.get("capacity"), cost=_cost(doc.get("cost")), has_gpus=doc["gpus"] > 0,
                  verdict=doc["verdict"], inconclusive_reasons=doc.get("inconclusive_reasons", []))


def charts_document(report: Report) -> str | None:
    """The report's charts as JSON (None when it has none), stored beside its document."""
    if report.gpu_time_chart is None and not report.culprit_charts:
        return None
    return json.dumps({"gpu_time": asdict(report.gpu_time_chart) if report.gpu_time_chart else None,
                       "culprits": [asdict(c) for c in report.culprit_charts]})


def add_charts(report: Report, document: str | None) -> Report:
    """`report` with the charts `charts_document` gave back (none: as it is)."""
    if document:
        doc = json.loads(document)
        if doc.get("gpu_time"):
            report.gpu_time_chart = GpuTimeChart(**doc["gpu_time"])
        report.culprit_charts = [CulpritChart(**{**c, "shade": tuple(c["shade"])}) for c in doc.get("culprits", [])]
    return report
