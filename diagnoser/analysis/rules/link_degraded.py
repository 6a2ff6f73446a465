"""link_degraded: a NIC's link runs below its peers' speed, went down, or flaps."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnoser.analysis.rules.base import BottleneckClass, Detection, WindowContext, against_peers

# A link below its peers' speed (a 200G NIC trained at 100G, or 4x lanes at 2x).
SLOW_LINK = 0.75
FEW_NODES = 4  # at most one node in this many with slow links from the start is a fault, not a hardware class
# Identical nodes carry the same NICs in the same slots, under the same names: a NIC's peers
# are the same device on the other nodes, where at least this many nodes have it (two that
# agree outvote a degraded one), so that a 200G storage NIC beside 400G compute NICs on
# every node is no fault. Names that differ from node to node fall back to the fabric's median.
SAME_DEVICE_NODES = 3
# What one drop of a link can cost the job: the outage, which no scrape saw as down (an
# outage of half a scrape interval is seen by one scrape in two: a longer one that none saw
# is unlikely; a window holds at least four scrapes), and the transport's recovery after it
# (RDMA connections retried, NCCL's collective resumed: seconds). Extra idle beyond what its
# drops can explain (a checkpoint's minutes in the same window) is another cause's.
LINK_RECOVERY = 10.0
UNSEEN_OUTAGE = 0.5 / 4  # of a window: half a scrape interval


def check(w: WindowContext) -> Detection | None:
    nicw = w.nic
    if not len(nicw):
        return None
    median_speed = w.fabric_speed_median
    if not np.isfinite(median_speed):
        median_speed = nicw["speed"].median()
    same_device = nicw["speed"].groupby(level="device")
    peer_speed = same_device.transform("median").where(same_device.transform("count") >= SAME_DEVICE_NODES,
                                                        median_speed)
    slow = nicw["speed"] < SLOW_LINK * peer_speed
    if not (slow.any() or (nicw["up"] == 0).any() or (nicw["carrier_changes"] > 0).any()):
        return None  # the common case, decided before any copy
    if "in_use" in nicw:  # a spare port down all along is not a fault
        nicw, slow, peer_speed = nicw[nicw["in_use"]], slow[nicw["in_use"]], peer_speed[nicw["in_use"]]
    if slow.any():
        # Slower than its peers is a fault where the link fell within the range, runs below a
        # sibling NIC of its own node, or is one of few nodes: a group of nodes that ran slower
        # all along is other hardware (a 25G job beside 200G ones), not degraded links.
        instances = nicw.index.get_level_values("instance")
        fell = nicw["speed"] < SLOW_LINK * nicw.get("top_speed", nicw["speed"])
        sibling = nicw["speed"] < SLOW_LINK * nicw["speed"].groupby(instances).transform("max")
        slow_nodes = set(instances[slow])
        few = len(slow_nodes) <= max(1, len(w.node) // FEW_NODES)
        slow = slow & (fell | sibling | few)
    down = nicw["up"] == 0
    flaps = nicw["carrier_changes"] > 0
    bad = nicw[slow | down | flaps]
    # A cause is one that can cause the idle: a link that went down for a few seconds once, or
    # a rail the job did without, while its GPUs waited no more than usual, cost it nothing.
    if not len(bad) or not w.impact:
        return None
    if w.has_gpu and not (slow | down).any():
        drops = np.ceil(float(bad["carrier_changes"].sum()) / 2)
        if w.excess * w.step > drops * (UNSEEN_OUTAGE * w.step + LINK_RECOVERY):
            return None
    culprits = sorted(set(bad.index.get_level_values("instance")))

    def why(i: str, d: str) -> str:
        if nicw.at[(i, d), "up"] == 0:
            return "down"
        if slow.at[(i, d)]:
            return f"{nicw.at[(i, d), 'speed'] * 8 / 1e9:.0f} Gb/s vs peers {peer_speed.at[(i, d)] * 8 / 1e9:.0f} Gb/s"
        return f"{nicw.at[(i, d), 'carrier_changes']:.0f} carrier changes"

    instances = nicw.index.get_level_values("instance")
    evidence: dict[str, object] = {"links": {f"{i} {d}": why(i, d) for i, d in bad.index}}
    # Each culprit's own figures beside its peers': its slowest link, its carrier changes.
    if slow.any():
        evidence["node_link_speed_gbps"] = against_peers(nicw["speed"].groupby(instances).min() * 8 / 1e9, culprits)
    if flaps.any():
        evidence["node_carrier_changes"] = against_peers(nicw["carrier_changes"].groupby(instances).sum(), culprits)
    evidence["gpu_idle"] = w.cluster["idle_frac"]
    def effect(node: str) -> float:
        """How much the culprit carries: how far its slowest link fell below the peers, and
        how often its links went down or flapped."""
        mine = instances == node
        ratio = (nicw["speed"][mine] / peer_speed[mine]).min()
        fell = max(0.0, 1 - float(ratio)) if np.isfinite(ratio) else 0.0
        return fell + float(nicw["carrier_changes"][mine].fillna(0).sum()) + float((nicw["up"][mine] == 0).sum())

    return Detection(culprits, sorted({d for _, d in bad.index}), 0.9, evidence,
                     effect={n: effect(n) for n in culprits})


def signature(node: pd.DataFrame) -> pd.Series:
    return ((node["nics_down"] > 0) | (node["carrier_changes"] > 0)).groupby(level="window").any()


RULE = BottleneckClass(
    name="link_degraded",
    title="Degraded link",
    confirm=('gpunet_nic_link_speed_bytes_per_second{instance=~"$NODES"} * on (instance, device) gpunet_nic_up\n'
             'or increase(gpunet_nic_carrier_changes_total{instance=~"$NODES"}[5m])'),
    remediation=(
        "A link runs below its peers, went down, or flaps, and the synchronous job runs at its pace. Check the "
        "speed and width the port negotiated (ethtool / ibstat), reseat or replace the cable or optic (a "
        "flapping link is usually a failing optic: look at its temperature and receive power), and the switch "
        "port's error counters. Drain the node until it is fixed."),
    check=check,
    localised=True,
    # The slow link's node looks like a straggler, the job like a network-bound or
    # input-bound one, and its retransmits and pauses like congestion.
    explains=frozenset({"network_congestion", "straggler", "host_bound", "network_bandwidth"}),
    chart=("bytes_rate", "bytes per second on the fabric"),
    signature=signature,
    nccl_signal="slow",  # a rank that moves its share slowly: its link or transfer path
)
