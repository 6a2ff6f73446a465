"""What the analysis finds, before it is reported: a class holding in one window, and
windows merged into an incident."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WindowFinding:
    window: float
    cls: str
    nodes: list[str]
    devices: list[str]
    confidence: float
    idle_seconds: float  # extra GPU idle in the window, over the baseline
    evidence: dict = field(default_factory=dict)
    effect: dict[str, float] = field(default_factory=dict)  # culprit -> its share of the effect


@dataclass
class Incident:
    cls: str
    start: float
    end: float
    nodes: list[str]
    devices: list[str]
    confidence: float
    gpu_idle_seconds: float
    windows: int
    evidence: dict = field(default_factory=dict)
    effect: dict[str, float] = field(default_factory=dict)  # culprit -> its effect, summed over the windows
