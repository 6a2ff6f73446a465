"""Where the diagnoser's data comes from: a replay trace or any engine with the Prometheus
HTTP API, and NCCL inspector dumps beside either. This module opens them, and is the one
place that catches their errors: whatever goes wrong reading reaches the caller as one
`SourceError` saying what and where.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from diagnoser.model.frame import Frame
from diagnoser.model.netconfig import METRICS as CONFIG_METRICS
from diagnoser.model.netconfig import ConfigSnapshot
from diagnoser.sources.nccl_dump import read_dumps
from diagnoser.sources.prometheus import config_by_groups, frame_from_prometheus
from diagnoser.sources.replay import TraceError, frame_from_trace
from gpunet.promapi import PromError, client_from_arguments
from gpunet.window import parse_duration, parse_time, resolve


class SourceError(Exception):
    """A source that cannot be read; str() says what and where (file and line, or server)."""


@dataclass(frozen=True)
class Connection:
    """How to reach a Prometheus API (the flags of gpunet.promapi.add_connection_arguments)."""
    bearer_token_file: str | None = None
    basic_auth_user: str | None = None
    ca_file: str | None = None
    timeout: float = 60.0


@dataclass(frozen=True)
class Source:
    """What to read: a trace (`replay`) or a server (`prometheus`), over a window given as
    on the command line (`since`, `start`, `end`: durations and times as text)."""
    replay: str | None = None
    prometheus: str | None = None
    since: str | None = None
    start: str | None = None
    end: str | None = None
    connection: Connection = field(default_factory=Connection)
    nccl: tuple[str, ...] = ()  # NCCL inspector dump files or folders
    # A server's per-node records (alerts/gpunet.rules.yml, group gpunet.diagnoser.records):
    # auto reads them where they exist over the window, on insists, off reads raw series.
    recording_rules: str = "auto"

    @property
    def name(self) -> str:
        return f"prometheus:{self.prometheus}" if self.prometheus else f"replay:{self.replay}"


Progress = Callable[[str], None]


def quiet(message: str) -> None:
    """The default progress: say nothing."""


def _from_trace(source: Source, progress: Progress, wanted: frozenset[str] | None = None) -> Frame:
    """The trace's frame; its window ends at its last sample unless --end says otherwise."""
    return frame_from_trace(str(source.replay), parse_duration(source.since) if source.since else None,
                            parse_time(source.start) if source.start else None,
                            parse_time(source.end) if source.end else None,
                            warn=lambda m: progress(f"warning: {m}"), wanted=wanted)


def read_frame(source: Source, progress: Progress = quiet, config: ConfigSnapshot | None = None) -> Frame:
    """The tidy frame of the source's window. `config`: its configuration snapshot, already
    read (a server's facts are then not asked; a trace reads them with the rest anyway)."""
    try:
        if source.replay:
            frame = _from_trace(source, progress)
            if config is not None:
                frame.config = config
            return frame
        start, end = resolve(source.since, source.start, source.end)
        return asyncio.run(_from_server(source, start, end, progress, config))
    except (TraceError, PromError, ValueError, OSError) as e:
        raise SourceError(str(e)) from None


async def _from_server(source: Source, start: float, end: float, progress: Progress,
                       config: ConfigSnapshot | None = None) -> Frame:
    async with client_from_arguments(str(source.prometheus), source.connection) as client:
        try:
            return await frame_from_prometheus(client, start, end, progress, source.recording_rules, config)
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            # An engine that answers with another shape than the HTTP API's: say so, in one line.
            raise PromError(f"{client.url}: an answer of an unexpected shape ({type(e).__name__}: "
                            f"{str(e)[:120]})") from None


def read_config(source: Source, progress: Progress = quiet) -> tuple[str, float, float, ConfigSnapshot]:
    """Only the configuration facts of the window: (source name, start, end, snapshot).
    A trace's other families are skipped unparsed; a server answers one instant query per
    configuration metric and node group."""
    try:
        if source.replay:
            frame = _from_trace(source, progress, CONFIG_METRICS)
            return frame.source, frame.start, frame.end, frame.config
        start, end = resolve(source.since, source.start, source.end)
        return source.name, start, end, asyncio.run(_config_from_server(source, start, end, progress))
    except (TraceError, PromError, ValueError, OSError) as e:
        raise SourceError(str(e)) from None


async def _config_from_server(source: Source, start: float, end: float, progress: Progress) -> ConfigSnapshot:
    async with client_from_arguments(str(source.prometheus), source.connection) as client:
        return await config_by_groups(client, start, end, progress)


def read_nccl(source: Source) -> pd.DataFrame:
    """The NCCL inspector samples of the source's dump files (empty where none were given)."""
    try:
        return read_dumps(list(source.nccl))
    except (OSError, ValueError) as e:
        raise SourceError(str(e)) from None
