"""The bottleneck classes (docs/classes.md), one module each; `RULES` in the order they
run in a window (each after the rules its record names in `after`).

    python -m diagnoser.analysis.rules > docs/classes.md   # the catalogue, from the records
"""

from __future__ import annotations

from diagnoser.analysis.rules import (
    gpu_throttle,
    host_bound,
    link_degraded,
    network_bandwidth,
    network_congestion,
    packet_loss,
    pfc_storm,
    straggler,
)
from diagnoser.analysis.rules.base import BottleneckClass

_MODULES = (pfc_storm, link_degraded, packet_loss, network_congestion, gpu_throttle, straggler, host_bound,
            network_bandwidth)


def _in_dependency_order(records: list[BottleneckClass]) -> dict[str, BottleneckClass]:
    """Each record after those it names in `after`; otherwise in the order given."""
    by_name = {r.name: r for r in records}
    ordered: dict[str, BottleneckClass] = {}

    def visit(record: BottleneckClass, path: tuple[str, ...]) -> None:
        if record.name in ordered:
            return
        if record.name in path:
            raise ValueError(f"rules run after each other in a circle: {' -> '.join((*path, record.name))}")
        for name in record.after:
            if name not in by_name:
                raise ValueError(f"rule {record.name} runs after {name!r}, which is no rule")
            visit(by_name[name], (*path, record.name))
        ordered[record.name] = record

    for record in records:
        visit(record, ())
    return ordered


RULES: dict[str, BottleneckClass] = _in_dependency_order([m.RULE for m in _MODULES])
EXPLAINS: dict[str, frozenset[str]] = {name: r.explains for name, r in RULES.items()}
WAITS_IN: dict[str, str | None] = {name: r.waits_in for name, r in RULES.items()}


def rule(name: str) -> BottleneckClass:
    """The record of a class; a clear error for a name that is no class."""
    try:
        return RULES[name]
    except KeyError:
        raise KeyError(f"no bottleneck class {name!r}; known: {', '.join(RULES)}") from None


def classes_markdown() -> str:
    """docs/classes.md: each class as its module and record say it (a test keeps them equal)."""
    import sys

    lines = ["# Bottleneck classes", "",
             "What `diagnose` names, one class per module of `diagnoser/analysis/rules/`; generated from them",
             "(`python -m diagnoser.analysis.rules > docs/classes.md`). A finding's `class` is one of these;",
             "`culprits` says whether its findings name the nodes at fault. How to read a finding:",
             "[diagnose.md](diagnose.md).", ""]
    for name in sorted(RULES):
        record = RULES[name]
        module = sys.modules[f"diagnoser.analysis.rules.{name}"]
        means = (module.__doc__ or "").strip().split(":", 1)[-1].strip()
        means = means[:1].upper() + means[1:]
        lines += [f"## `{name}`: {record.title}", "", " ".join(means.split()), "",
                  f"- culprits: {'named (the nodes at fault)' if record.localised else 'none (the fabric, the job)'}",
                  f"- GPUs wait with the network {record.waits_in}" if record.waits_in
                  else "- GPUs wait on no network state",
                  f"- confirm with: `{' '.join(record.confirm.split())}`",
                  f"- what to do: {record.remediation}", ""]
    return "\n".join(lines)
