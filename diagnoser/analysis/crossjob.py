"""Jobs that share a fabric: one job's fault seen from another job.

A PFC storm from one job's node pauses every link behind the same switches, whichever job
they carry (a class's record says whether its effect `reaches_other_jobs`). Diagnosed job
by job, the other jobs see pauses they did not send and report
congestion (or GPUs idling with a quiet network) with no culprit of their own. Here such a
finding is recognised as a symptom of the cause found in the other job (the cause's class
record says which classes it produces as symptoms, `explains`) over the same time: the
cause is reported once, in the job of its source, listing the jobs that waited on it, and
each victim job is told where its waiting came from.

Congestion has no source node: one job's traffic (an all-to-all over oversubscribed
uplinks) fills the queues that other jobs' flows cross, and every job through them sees
marks. Where two jobs report it over the same time, the one whose traffic the fabric marks
most per byte has most of its flows in the congested queues: its own traffic fills them.
The finding stays with it; the other job waited on it.
"""

from __future__ import annotations

from diagnoser.analysis.rules import RULES
from diagnoser.model.report import FINDINGS, Finding, JobSummary

SAME_TIME = 0.5  # the symptom lies at least this share of its span within the cause's


def attribute(findings: list[Finding], jobs: list[JobSummary]) -> list[Finding]:
    """The findings less those that are another job's cause seen from outside; the causes
    gain `victims`, the victim jobs `waited_on` and a note, and their counts are redone."""
    causes = [f for f in findings if RULES[f.cls].reaches_other_jobs and (f.nodes or not RULES[f.cls].localised)]
    by_name = {j.name: j for j in jobs}
    kept = []
    for f in findings:
        cause = _root_cause(f, causes)
        if cause is None or f.job not in by_name:
            kept.append(f)
            continue
        idle = f.gpu_idle_seconds
        listed = next((v for v in cause.victims if v["job"] == f.job), None)
        if listed is None:
            cause.victims.append({"job": f.job, "seen_as": f.cls, "start": f.start, "end": f.end,
                                  "gpu_idle_seconds": idle})
        else:  # the same job hurt in several stretches of the cause: one entry, its idle summed
            listed.update(start=min(listed["start"], f.start), end=max(listed["end"], f.end),
                          gpu_idle_seconds=(listed["gpu_idle_seconds"] or 0.0) + (idle or 0.0))
        job = by_name[str(f.job)]
        job.waited_on.append({"job": cause.job, "class": cause.cls, "nodes": cause.nodes, "start": f.start,
                              "end": f.end, "gpu_idle_seconds": idle})
        culprit = f" (culprit {', '.join(cause.nodes)})" if cause.nodes else ""
        job.notes.append(f"its GPUs waited on a {RULES[cause.cls].title} in job {cause.job}{culprit} over the "
                         f"shared fabric: seen here as {f.cls}, reported there")
    for job in jobs:
        own = [f for f in kept if f.job == job.name]
        job.findings = len(own)
        job.gpu_idle_seconds_in_findings = round(sum(f.gpu_idle_seconds or 0.0 for f in own), 1)
        if job.waited_on:
            job.verdict, job.inconclusive_reasons = FINDINGS, []
    return kept


def _root_cause(f: Finding, causes: list[Finding]) -> Finding | None:
    """The other job's finding that explains `f`, followed to the one nothing explains (a
    job that saw a storm as congestion is no cause for a third job's congestion: the storm
    is). Causes that name their source come first."""
    cause, seen = None, {id(f)}
    while True:
        explaining = next((c for c in sorted(causes, key=lambda c: not c.nodes) if id(c) not in seen
                           and c.job != f.job and not f.nodes and _within(f, c) and _explains(c, f)), None)
        if explaining is None:
            return cause
        cause = f = explaining
        seen.add(id(f))


def _explains(cause: Finding, symptom: Finding) -> bool:
    if symptom.cls in RULES[cause.cls].explains:
        return True
    # The same fabric-wide condition (congestion: no culprit node) seen from two jobs: it is
    # the cause where its traffic is marked more.
    return symptom.cls == cause.cls and not RULES[cause.cls].localised and _marks(cause) > _marks(symptom)


def _marks(f: Finding) -> float:
    value = f.evidence.get("ecn_marks_per_gb")
    return float(value) if isinstance(value, (int, float)) else 0.0


def _within(symptom: Finding, cause: Finding) -> bool:
    overlap = min(symptom.end, cause.end) - max(symptom.start, cause.start)
    return overlap >= SAME_TIME * (symptom.end - symptom.start)
