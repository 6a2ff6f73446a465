"""NCCL inspector dumps (NCCL_INSPECTOR_PROM_DUMP files, see diagnoser/analysis/nccl.py for
what their figures say): per-rank bus bandwidth samples, from files or folders of them."""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd

from diagnoser.model.columns import NCCL_BUS_BANDWIDTH as METRIC
from diagnoser.model.columns import NCCL_COLUMNS as COLUMNS
from diagnoser.model.columns import nccl_key
from diagnoser.sources.exposition import parse_series

_LINE = re.compile(r"^(\S+?\{.*\}|\S+)\s+(\S+)(?:\s+(\S+))?\s*$")


def parse(text: str, origin: str = "") -> pd.DataFrame:
    """The bus-bandwidth samples of one exposition text."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.startswith(METRIC):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{origin}:{lineno}: not an exposition sample: {line[:120]!r}")
        try:
            name, labels = parse_series(m.group(1))
            value = float(m.group(2))
        except ValueError as e:
            raise ValueError(f"{origin}:{lineno}: {e}") from None
        if name != METRIC or not np.isfinite(value):
            continue
        when = _when(labels.get("timestamp", ""))
        if not np.isfinite(when) and m.group(3):
            when = float(m.group(3)) / 1000.0  # exposition timestamps are milliseconds
        rows.append((*nccl_key(labels), value, when))
    return pd.DataFrame(rows, columns=COLUMNS)


def _when(text: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return float("nan")


def read_dumps(paths: list[str]) -> pd.DataFrame:
    """Samples from dump files, or folders of them (*.prom)."""
    frames = []
    for p in map(Path, paths):
        files = sorted(p.glob("*.prom")) if p.is_dir() else [p]
        if p.is_dir() and not files:
            raise ValueError(f"{p}: no .prom files (NCCL_INSPECTOR_PROM_DUMP output) in the folder")
        for f in files:
            frames.append(parse(f.read_text(encoding="utf-8", errors="replace"), str(f)))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
