"""The node frame from recorded per-node series: the group `gpunet-diagnoser` of
alerts/gpunet.rules.yml, evaluated by whatever rule engine the user runs (Prometheus, Thanos
Ruler, Mimir's ruler, vmalert).

Each record holds one series per node (and per split label: a PFC direction, a network
state), so a diagnosis reads some 30 series a node however many NICs and GPUs it has. A
counter is recorded as its growth since the rule's previous evaluation, summed over the
node's fabric NICs or GPUs (`:increase`): each series' reset is handled where it happens, and
a NIC or GPU that appears or leaves adds nothing (a sum of the counters themselves would drop
by a whole counter when one NIC left, and read as a reset of them all). A window's growth is
then the sum of the samples inside it, which is exact wherever the windows are whole
multiples of the rules' interval.

Templates: `$M` the instance matcher, `$W` the window less 1 ms, read at its end (the raw
reads' 1 ms offset left out: the sample at a window's end holds the growth up to that end;
and 1 ms short, since the windows start on a record too, which Prometheus 2's closed ranges
would count in two windows).
"""

from __future__ import annotations

import numpy as np

from gpunet import contract as c
from gpunet.promapi import PrometheusClient
from gpunet.promql import regex_literal
from gpunet.window import rfc3339

GROUP = "gpunet.diagnoser.records"  # the group's name in alerts/gpunet.rules.yml


def increase_name(metric: str) -> str:
    """The record of a counter's per-node growth: instance:<metric less _total>:increase."""
    return f"instance:{metric.removesuffix('_total')}:increase"


# The counters summed per node, by the diagnoser column's metric (diagnoser/model/columns.py):
# the NIC counters over the node's fabric NICs, the GPU counters over its GPUs.
SUMMED = (c.NIC_TRANSMIT_BYTES.name, c.NIC_RECEIVE_BYTES.name, c.NIC_ECN_MARKED.name, c.NIC_CNP_SENT.name,
          c.NIC_CNP_RECEIVED.name, c.NIC_RDMA_LOSS_EVENTS.name, c.NIC_RECEIVE_DISCARDS.name,
          c.NIC_RECEIVE_ERRORS.name, c.NIC_CARRIER_CHANGES.name, c.NIC_SATURATED_SECONDS.name,
          c.NIC_TRANSMIT_WAIT.name, c.NIC_PFC_PAUSE_FRAMES.name, c.GPU_BUSY_SECONDS.name, c.GPU_IDLE_SECONDS.name)
THROTTLED = "instance:gpunet_gpu_throttled_seconds:sum_max_increase"  # each GPU's worst reason, summed
GPUS = "instance:gpunet_gpu_busy_seconds:count"
SM_CLOCK = "instance:gpunet_gpu_sm_clock_hertz:avg"
CAPACITY = "instance:gpunet_nic_fabric_link_speed_bytes_per_second:sum"
OTHER_CAPACITY = "instance:gpunet_nic_other_link_speed_bytes_per_second:sum"
NICS_DOWN = "instance:gpunet_nic_fabric_down:count"
FABRIC_NICS = "instance:gpunet_nic_fabric:count"
OTHER_BYTES = "instance:gpunet_nic_other_busier_direction_bytes:increase"
SPEEDS = "instance:gpunet_nic_fabric_link_speed_bytes_per_second:count_values"

NAMES = tuple(increase_name(m) for m in SUMMED) + (THROTTLED, GPUS, SM_CLOCK, CAPACITY, OTHER_CAPACITY, NICS_DOWN,
                                                    FABRIC_NICS, OTHER_BYTES, SPEEDS)
# The record whose samples tell whether the records exist over the window, and their interval.
PROBE = increase_name(c.NIC_TRANSMIT_BYTES.name)


def summed(record: str, labels: tuple[str, ...], window: float, every: float) -> str:
    """A counter record's growth within each window of `window` seconds, by `labels` (none:
    the sum). A series counts in a window where it has the window's first interval, as a raw
    counter counts where it has a sample before the window: a node that joins inside a window
    counts from the next, never with part of its growth (which would read as a slow node)."""
    w, i = int(round(window * 1000)), int(round(every * 1000))
    inner = f"sum_over_time({record}{{$M}}[{w - 1}ms])"  # 1 ms short: see the module doc
    if w > i:
        inner += f" and count_over_time({record}{{$M}}[{i - 1}ms] offset {w - i}ms)"
    return f"sum{' by (' + ', '.join(labels) + ')' if labels else ''} ({inner})"


def node_queries(window: float, every: float) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The node columns that are not a counter of COLUMNS, read from the records, as
    frame_from_prometheus names them: {name -> (template, labels)}."""
    by_instance = ("instance",)
    return {
        "throttled": (summed(THROTTLED, by_instance, window, every), by_instance),
        "gpus": (f"sum by (instance) (max_over_time({GPUS}{{$M}}[$W]))", by_instance),
        "sm_clock": (f"avg by (instance) (avg_over_time({SM_CLOCK}{{$M}}[$W]))", by_instance),
        "capacity": (f"sum by (instance) (avg_over_time({CAPACITY}{{$M}}[$W]))", by_instance),
        "nics_down": (f"sum by (instance) (max_over_time({NICS_DOWN}{{$M}}[$W]))", by_instance),
        "fabric_nics": (f"sum by (instance) (max_over_time({FABRIC_NICS}{{$M}}[$W]))", by_instance),
        "other_bytes": (summed(OTHER_BYTES, by_instance, window, every), by_instance),
        "other_capacity": (f"sum by (instance) (avg_over_time({OTHER_CAPACITY}{{$M}}[$W]))", by_instance),
    }


# How many fabric NICs had each speed, per window (summed over node groups, then the median).
SPEED_COUNTS = f"sum by (speed) (max_over_time({SPEEDS}{{$M}}[$W]))"
BUSY = increase_name(c.GPU_BUSY_SECONDS.name)
IDLE = increase_name(c.GPU_IDLE_SECONDS.name)



async def recorded_span(client: PrometheusClient, start: float, end: float) -> tuple[float, float, float] | str:
    """(the records' interval, their first and last sample) where the records have series in
    [start, end]; else why not, in words. Three cheap queries: the probe's name in the index,
    the node with most probe samples, and that node's probe samples (their spacing, measured
    as the scrape interval is)."""
    # The probe alone says the group runs: the records of counters a cluster does not export
    # (InfiniBand's transmit wait on RoCE, say) are absent as those counters are.
    if not await client.label_values("__name__", [f'{{__name__="{PROBE}"}}'], start, end):
        return f"no recorded series {PROBE} (group {GROUP} of alerts/gpunet.rules.yml)"
    span = f"{int(round((end - start) * 1000))}ms"
    top = (await client.query(f"topk(1, count_over_time({PROBE}[{span}]))", end)).get("result", [])
    if not top:
        return f"no samples of {PROBE} between {rfc3339(start)} and {rfc3339(end)}"
    instance = top[0]["metric"].get("instance", "")
    raw = await client.query(f'{PROBE}{{instance=~"{regex_literal(instance)}"}}[{span}]', end)
    stamps = [np.array([float(t) for t, _ in series.get("values", [])]) for series in raw.get("result", [])]
    stamps = [t for t in stamps if len(t) > 1]
    if not stamps:
        return f"fewer than 2 samples of {PROBE} between {rfc3339(start)} and {rfc3339(end)}"
    interval = round(float(np.median([np.median(np.diff(t)) for t in stamps])), 3)
    return interval, min(float(t[0]) for t in stamps), max(float(t[-1]) for t in stamps)
