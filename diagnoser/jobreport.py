"""One diagnosis per job: each job's frame through the unchanged pipeline (features,
classify, incidents), its findings reported under its name.

JSON: contract section 5's keys as they are (the cluster's summary, `findings`), each
finding with a `job` key, and a `jobs` list (per job: nodes, gpus, gpu_idle_fraction, the
instances, how it was found). Text and markdown: a heading per job, the worst job first.
"""

from __future__ import annotations

from diagnoser.capacity import ModelSize, advise
from diagnoser.audit_report import configuration_lines
from diagnoser.classify import classify
from diagnoser.features import Features, compute
from diagnoser.frame import Frame
from diagnoser.incidents import Incident, absorb_symptoms, merge, periodic_stalls
from diagnoser.jobs import Job, subset
from diagnoser.report import add_cost, capacity_and_cost_lines, summary, to_json, to_text


def run(frame: Frame) -> tuple[Features, list[Incident], list[Incident]]:
    """features -> classify -> incidents on one frame: (features, incidents, periodic stalls)."""
    features = compute(frame)
    incidents, stalls = periodic_stalls(
        absorb_symptoms(merge(classify(features), frame.step), frame.step), frame.step)
    return features, incidents, stalls


def stall_note(stalls: list[Incident]) -> str:
    return f"{len(stalls)} brief, periodic GPU stalls with a quiet network (checkpoints?) were left out"


def diagnose_jobs(frame: Frame, jobs: list[Job], notes: list[str],
                  per_job: dict[str, Features] | None = None, model: ModelSize | None = None,
                  price: float | None = None, currency: str = "") -> tuple[Features, dict]:
    """The whole cluster's summary and every job's findings in one document (each job's
    features into `per_job` when given). Capacity advice is per job (each job has its own
    traffic and model); cost per finding, per job and for the cluster."""
    whole = compute(frame)
    doc = {"source": frame.source, "start": round(frame.start, 3), "end": round(frame.end, 3), **summary(whole),
           "jobs": [], "findings": []}
    notes = list(notes)
    for job in jobs:
        features, incidents, stalls = run(subset(frame, job.instances, job.start, job.end))
        if per_job is not None:
            per_job[job.name] = features
        part = to_json(features, incidents, [])
        add_cost(part, features, price, currency)
        cost = sum(f["gpu_idle_seconds"] or 0.0 for f in part["findings"])
        entry = {"name": job.name, "found_by": job.how, "start": part["start"], "end": part["end"],
                 "nodes": part["nodes"], "gpus": part["gpus"],
                 "gpu_idle_fraction": part["gpu_idle_fraction"], "instances": job.instances,
                 "findings": len(part["findings"]), "gpu_idle_seconds_in_findings": round(cost, 1)}
        capacity = advise(features, model)
        if capacity is not None:
            entry["capacity"] = capacity
        if "cost" in part:
            entry["cost"] = part["cost"]
        doc["jobs"].append(entry)
        for f in part["findings"]:
            doc["findings"].append({"job": job.name, **f})
        if stalls:
            notes.append(f"{job.name}: {stall_note(stalls)}")
        notes.extend(f"{job.name}: {n}" for n in job.notes)
    doc["jobs"].sort(key=lambda j: (-j["gpu_idle_seconds_in_findings"], -(j["gpu_idle_fraction"] or 0), j["name"]))
    order = {j["name"]: k for k, j in enumerate(doc["jobs"])}
    doc["findings"].sort(key=lambda f: (order[f["job"]], -(f["gpu_idle_seconds"] or 0.0)))
    if not frame.has_gpus:
        notes.append("no GPU series: network conditions are reported, their GPU impact is unknown")
    if notes or frame.warnings:
        doc["notes"] = notes + frame.warnings[:20]
    add_cost(doc, whole, price, currency)
    return whole, doc


def only(doc: dict, name: str) -> dict:
    """The document of one job (`diagnose --job NAME`)."""
    out = dict(doc)
    out["jobs"] = [j for j in doc["jobs"] if j["name"] == name]
    for job in out["jobs"]:  # the summary and the cost are the job's, not the cluster's
        out.update({k: job[k] for k in ("start", "end", "nodes", "gpus", "gpu_idle_fraction")})
        out.pop("cost", None)
        if "cost" in job:
            out["cost"] = job["cost"]
    out["findings"] = [f for f in doc["findings"] if f["job"] == name]
    out["notes"] = [n for n in doc.get("notes", []) if n.startswith(f"{name}: ") or ": " not in n[:80]]
    if not out["notes"]:
        out.pop("notes")
    return out


def to_text_jobs(doc: dict, markdown: bool = False) -> str:
    """A heading per job, worst first; under it the job's findings as `to_text` writes them."""
    h2 = "## " if markdown else ""
    head = to_text({**doc, "findings": [], "notes": []}, markdown).splitlines()
    lines = [head[0], head[1], f"{len(doc['jobs'])} job(s): " + ", ".join(j["name"] for j in doc["jobs"]), ""]
    for job in doc["jobs"]:
        part = {**{k: v for k, v in doc.items() if k not in ("capacity", "cost", "configuration")},
                **{k: job[k] for k in ("start", "end", "nodes", "gpus", "gpu_idle_fraction")},
                "findings": [{k: v for k, v in f.items() if k != "job"} for f in doc["findings"]
                             if f["job"] == job["name"]], "notes": []}
        if "capacity" in job:
            part["capacity"] = job["capacity"]
        if "cost" in job:  # the job's GPU-hours (and money) under its findings
            part["cost"] = job["cost"]
        body = to_text(part, markdown).splitlines()
        found = "workload " + job["found_by"] if job["found_by"] != "behaviour" else "grouped by behaviour"
        lines.append(f"{h2}job {job['name']} ({found})")
        lines.append(body[1])  # its window, nodes, GPUs and idle
        for line in body[2:]:
            lines.append(line.replace(h2, "### ", 1) if markdown and line.startswith(h2) else line)
        lines.append("")
    lines.extend(line.replace("Cost:", "Cluster cost, all jobs:", 1)
                 for line in capacity_and_cost_lines({"cost": doc["cost"]} if "cost" in doc else {}, h2))
    lines.extend(configuration_lines(doc, markdown))
    for note in doc.get("notes", [])[:8]:
        lines.append(f"note: {note}")
    return "\n".join(lines).rstrip() + "\n"
