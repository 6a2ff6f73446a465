"""Alertmanager's webhook payload (version "4") read into what the service diagnoses: the
group's key, whether it fires, the jobs its alerts name (their `workload` label) and when
the earliest alert began. Anything else is refused with one line naming the problem."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpunet.window import parse_time

MAX_BODY_BYTES = 1 << 20  # Alertmanager's groups are kilobytes; more is no webhook


class PayloadError(ValueError):
    """Not a version 4 webhook payload; str() names the field."""


@dataclass(frozen=True)
class AlertGroup:
    group_key: str
    firing: bool
    jobs: tuple[str, ...]  # the firing alerts' workloads; () when one has none: every job
    earliest_start: float


def _field(doc: dict, key: str, kind: type, where: str = "") -> object:
    value = doc.get(key)
    if not isinstance(value, kind):
        raise PayloadError(f"{where}{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _time(text: str, where: str) -> float:
    """Alertmanager writes nanoseconds (…:00.123456789Z); Python reads to microseconds."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        return parse_time(trimmed)
    except ValueError:
        raise PayloadError(f"{where}startsAt: not a time: {text[:40]!r}") from None


def parse(body: bytes) -> AlertGroup:
    """The alert group of a webhook body, or PayloadError."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise PayloadError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise PayloadError("expected a JSON object")
    if doc.get("version") != "4":
        raise PayloadError(f"version: expected \"4\" (Alertmanager's webhook), got {json.dumps(doc.get('version'))}")
    for key, kind in (("receiver", str), ("status", str), ("groupKey", str), ("externalURL", str),
                      ("groupLabels", dict), ("commonLabels", dict), ("alerts", list)):
        _field(doc, key, kind)
    if doc["status"] not in ("firing", "resolved"):
        raise PayloadError(f"status: expected firing or resolved, got {doc['status'][:40]!r}")
    if not doc["groupKey"]:
        raise PayloadError("groupKey: empty")
    jobs: set[str] = set()
    everything = False
    starts = []
    for n, alert in enumerate(doc["alerts"]):
        where = f"alerts[{n}]."
        if not isinstance(alert, dict):
            raise PayloadError(f"alerts[{n}]: expected object")
        labels = _field(alert, "labels", dict, where)
        _field(alert, "annotations", dict, where)
        starts.append(_time(str(_field(alert, "startsAt", str, where)), where))
        _field(alert, "endsAt", str, where)
        if alert.get("status", "firing") != "firing":
            continue
        workload = labels.get("workload") if isinstance(labels, dict) else None
        if isinstance(workload, str) and workload:
            jobs.add(workload)
        else:
            everything = True
    if not starts:
        raise PayloadError("alerts: empty")
    return AlertGroup(doc["groupKey"], doc["status"] == "firing", () if everything else tuple(sorted(jobs)),
                      min(starts))
