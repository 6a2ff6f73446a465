"""Jobs that share a fabric: one job's fault seen from another job.

A PFC storm from one job's node pauses every link behind the same switches, whichever job
they carry (a class's record says whether its effect `reaches_other_jobs`). Diagnosed job
by job, the other jobs see pauses they did not send and report
congestion (or GPUs idling with a quiet network) with no culprit of their own. Here such a
finding is recognised as a symptom of the cause found in the other job (the cause's class
record says which classes it produces as symptoms, `explains`) over the same time: the
cause is reported once, in the job of its source, listing the jobs that waited on it, and
each victim job is told where its waiting came from.
"""

from __future__ import annotations

from diagnoser.analysis.rules import RULES
from diagnoser.model.report import FINDINGS, Finding, JobSummary

SAME_TIME = 0.5  # the symptom lies at least this share of its span within the cause's


def attribute(findings: list[Finding], jobs: list[JobSummary]) -> list[Finding]:
    """The findings less those that are another job's cause seen from outside; the causes
    gain `victims`, the victim jobs `waited_on` and a note, and their counts are redone."""
    causes = [f for f in findings if f.nodes and RULES[f.cls].reaches_other_jobs]
    by_name = {j.name: j for j in jobs}
    kept = []
    for f in findings:
        cause = next((c for c in causes if c.job != f.job and not f.nodes and f.cls in RULES[c.cls].explains
                      and _within(f, c)), None)
        if cause is None or f.job not in by_name:
            kept.append(f)
            continue
        idle = f.gpu_idle_seconds
        cause.victims.append({"job": f.job, "seen_as": f.cls, "start": f.start, "end": f.end, "gpu_idle_seconds": idle})
        job = by_name[str(f.job)]
        job.waited_on.append({"job": cause.job, "class": cause.cls, "nodes": cause.nodes, "start": f.start,
                              "end": f.end, "gpu_idle_seconds": idle})
        job.notes.append(f"its GPUs waited on a {RULES[cause.cls].title} in job {cause.job} (culprit "
                         f"{', '.join(cause.nodes)}) over the shared fabric: seen here as {f.cls}, reported there")
    for job in jobs:
        own = [f for f in kept if f.job == job.name]
        job.findings = len(own)
        job.gpu_idle_seconds_in_findings = round(sum(f.gpu_idle_seconds or 0.0 for f in own), 1)
        if job.waited_on:
            job.verdict, job.inconclusive_reasons = FINDINGS, []
    return kept


def _within(symptom: Finding, cause: Finding) -> bool:
    overlap = min(symptom.end, cause.end) - max(symptom.start, cause.start)
    return overlap >= SAME_TIME * (symptom.end - symptom.start)
