"""pfc_storm: a host transmits PFC pauses without end and freezes its neighbours."""

from __future__ import annotations

import pandas as pd

from diagnoser.analysis.features import receiving_pauses
from diagnoser.analysis.rules import counts
from diagnoser.analysis.rules.base import BottleneckClass, Detection, WindowContext, against_peers, any_node

# A NIC stuck in XOFF refreshes its pauses every few hundred microseconds, i.e. thousands of
# frames a second; a healthy DCQCN fabric sends a handful per second at most.
STORM_TX_RATE = 500.0  # pause frames per second sent by one node
# ... and ten times what its peers' rate predicts: back-pressure from congestion makes many
# nodes send pauses at similar rates; a stuck receive path makes one node send far more.
# A ratio, not a z-score, so that it holds on 2 or 3 nodes as on 1000.
STORM_RATIO = 10.0
SATURATING_PAUSED_IDLE = 0.2  # GPU idle in paused ticks at which confidence stops growing


def check(w: WindowContext) -> Detection | None:
    nw = w.node
    rate = nw["pfc_tx_rate"]
    high = rate[rate >= STORM_TX_RATE]
    if not len(high):
        return None
    # Each candidate's pauses as a count against what the typical nodes' rate predicts
    # (rules/counts.py: two storming nodes do not hide each other; where every node is high,
    # one far above the rest still stands out).
    sent = nw["pfc_tx"] if "pfc_tx" in nw else rate * w.step
    table = counts.against_background(sent, pd.Series(w.step, index=nw.index), STORM_RATIO)
    storm = high[table["holds"].reindex(high.index, fill_value=False).astype(bool)]
    if not len(storm):
        return None
    culprits = list(storm.sort_values(ascending=False).index)
    # Victims: the other nodes receiving pauses, per fabric NIC as network_congestion counts them.
    victims = int((receiving_pauses(nw) & ~nw.index.isin(culprits)).sum())
    g = w.cluster
    confidence = 0.6 + 0.4 * min(g["idle_paused_frac"] / SATURATING_PAUSED_IDLE, 1.0) if w.has_gpu else 0.7
    return Detection(culprits, w.devices(culprits, "pfc_tx_rate"), confidence, {
        "pause_tx_per_s": against_peers(rate, culprits), "pauses_sent": counts.evidence(table, culprits),
        "nodes_receiving_pauses": victims,
        "gpu_idle_paused": g["idle_paused_frac"], "gpu_idle": g["idle_frac"]},
        effect={n: float(rate[n]) for n in culprits})


RULE = BottleneckClass(
    name="pfc_storm",
    title="PFC storm",
    confirm='sum by (instance) (rate(gpunet_nic_pfc_pause_frames_total{direction="transmit", instance=~"$NODES"}[5m]))',
    remediation=(
        "The named NIC keeps sending PFC pauses and freezes its neighbours. Drain the node or shut its switch "
        "port now; enable the switch's PFC watchdog (storm protection) fabric-wide. Then look at the host: a "
        "receive path that does not drain (stuck driver or firmware, PCIe errors, NIC on the wrong NUMA node "
        "or a degraded PCIe link), dmesg, the NIC firmware version."),
    check=check,
    localised=True,
    waits_in="paused",
    # The victims' received pauses look like congestion; their stalled fabric leaves GPUs
    # idle with nothing on the wire; in the window where the storm starts or ends, each node's
    # scrapes catch it at a different moment, so some look as if they idled less (stragglers).
    explains=frozenset({"network_congestion", "host_bound", "straggler"}),
    reaches_other_jobs=True,
    signature=lambda node: any_node(node, "pfc_tx_rate", STORM_TX_RATE),
    chart=("pfc_tx_rate", "PFC pauses sent per second"),
)
