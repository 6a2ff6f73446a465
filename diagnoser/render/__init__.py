"""The report rendered: text and markdown for people, JSON for scripts (docs/diagnose.md),
a self-contained HTML page with charts."""

from __future__ import annotations

import json

from diagnoser.model.report import AuditReport, Report
from diagnoser.render.text import render_audit_text, render_text

FORMATS = ("text", "markdown", "json")


def render(report: Report | AuditReport, fmt: str) -> str:
    """The report in one of FORMATS."""
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=1, allow_nan=False, default=str)
    if isinstance(report, AuditReport):
        return render_audit_text(report, markdown=fmt == "markdown")
    return render_text(report, markdown=fmt == "markdown")
