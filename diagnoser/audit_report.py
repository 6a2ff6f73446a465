"""The configuration audit in the report: the "configuration" list of the JSON document,
the "Configuration" section of text/markdown (compact: counts and the first few nodes,
readable on one screen for hundreds of nodes), and the cross-reference from runtime
findings to the configuration of their culprits."""

from __future__ import annotations

from dataclasses import asdict

from diagnoser.audit import ConfigFinding, audit
from diagnoser.config import ConfigSnapshot
from gpunet.window import rfc3339

NODES_SHOWN = 4  # nodes named per finding in text
DEVICES_SHOWN = 4  # devices named per node
XREF_SHOWN = 4  # configuration facts added to a runtime finding's evidence


def add_configuration(doc: dict, cfg: ConfigSnapshot) -> list[ConfigFinding]:
    """Audit `cfg` into `doc` (the runtime report): doc["configuration"], notes, and each
    runtime finding's culprits' configuration findings in its evidence."""
    findings, notes = audit(cfg)
    doc["configuration"] = [asdict(f) for f in findings]
    for runtime in doc.get("findings", []):
        related = []
        for node in runtime.get("nodes", []):
            for f in findings:
                if node in f.devices:
                    related.append(f"{node}: {f.check} ({', '.join(f.devices[node][:DEVICES_SHOWN])})")
        if related:
            runtime["evidence"]["configuration"] = "; ".join(related[:XREF_SHOWN]) + (
                f"; and {len(related) - XREF_SHOWN} more" if len(related) > XREF_SHOWN else "")
    if notes:
        doc["notes"] = doc.get("notes", []) + [f"configuration: {n}" for n in notes]
    return findings


def audit_document(source: str, start: float, end: float, cfg: ConfigSnapshot) -> dict:
    """The document of `diagnose --audit`: the configuration audit only."""
    nodes = set(cfg.nic.index.get_level_values("instance")) | set(cfg.gpu.index.get_level_values("instance"))
    doc = {"source": source, "start": round(start, 3), "end": round(end, 3), "nodes": len(nodes)}
    add_configuration(doc, cfg)
    return doc


def _nodes(f: dict) -> str:
    shown = []
    for node in f["nodes"][:NODES_SHOWN]:
        devs = f["devices"][node]
        more = f" +{len(devs) - DEVICES_SHOWN}" if len(devs) > DEVICES_SHOWN else ""
        shown.append(f"{node} ({', '.join(devs[:DEVICES_SHOWN])}{more})")
    rest = len(f["nodes"]) - NODES_SHOWN
    return ", ".join(shown) + (f" and {rest} more nodes" if rest > 0 else "")


def configuration_lines(doc: dict, markdown: bool = False) -> list[str]:
    """The "Configuration" section (after the runtime findings)."""
    if "configuration" not in doc:
        return []
    found = doc["configuration"]
    lines = [f"{'## ' if markdown else ''}Configuration" + (f" ({len(found)} findings)" if found else "")]
    if not found:
        lines.append("No configuration finding." if not any(n.startswith("configuration:")
                                                               for n in doc.get("notes", []))
                     else "No configuration finding in what is known (see the notes).")
    for n, f in enumerate(found, 1):
        devices = sum(len(d) for d in f["devices"].values())
        lines.append(f"{'### ' if markdown else ''}C{n}. [{f['severity']}] {f['title']} ({f['check']}): "
                     f"{_count(len(f['nodes']), 'node')}, {_count(devices, 'device')}")
        lines.append(f"   {_nodes(f)}")
        lines.append(f"   seen: {f['detail']}")
        lines.append(f"   why: {f['why']}")
        lines.append(f"   fix: {f['fix']}")
    lines.append("")
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def audit_text(doc: dict, markdown: bool = False) -> str:
    lines = [f"{'# ' if markdown else ''}gpunet configuration audit of {doc['source']}",
             f"window {rfc3339(doc['start'])} .. {rfc3339(doc['end'])}, {doc['nodes']} nodes", ""]
    lines += configuration_lines(doc, markdown)
    for note in doc.get("notes", [])[:8]:
        lines.append(f"note: {note}")
    if markdown:  # paragraphs instead of the terminal's indentation, as report.to_text
        lines = [("\n" + l[3:]) if l.startswith("   ") else l for l in lines]
    return "\n".join(lines).rstrip() + "\n"
