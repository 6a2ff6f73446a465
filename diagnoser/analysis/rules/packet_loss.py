"""packet_loss: go-back-N retransmission (RDMA loss events) or TCP retransmits stall the
collectives."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnoser.analysis.rules.base import (
    EXCESS_IDLE,
    BottleneckClass,
    Detection,
    WindowContext,
    against_peers,
    others_median,
)

# Go-back-N events per second on some node; a clean fabric has none for hours. The bar is
# the worst node's rate, not the job's mean: a bad cable or optic is one link's loss, and
# stalls every collective through that node however many healthy nodes share the job.
LOSS_RATE = 1.0
RETRANS_RATIO = 0.005  # TCP retransmitted / sent segments; datacentre TCP sits below 0.1%
# ... or ten times the job's own background: in a collective every lost tail segment can
# cost a retransmission timeout (200 ms minimum on Linux), so even rare loss stalls it.
RETRANS_RISE = 10.0
RETRANS_FLOOR = 1e-5
# A node holds the loss when its own rate is ten times its peers' median (or its peers have
# none) and it carries at least half of the worst node's: one bad cable or optic. A ratio,
# not a z-score, so that it holds on 2 or 3 nodes as on 1000.
LOCAL_RATIO = 10.0
# A node's own TCP retransmit ratio that counts, even where the job's ratio stays low: on a
# node of a synchronous job 0.01% already means a retransmission timeout every few seconds.
RETRANS_NODE = 1e-4
LOCAL_SHARE = 4  # at most one node in this many: loss on more is the fabric's, not a node's


def _local(values: pd.Series) -> list[str]:
    """The nodes that hold the loss, worst first; none where it is spread over the job."""
    values = values.fillna(0)
    top = float(values.max()) if len(values) else 0.0
    if top <= 0:
        return []
    others = others_median(values)
    holds = values[(values >= 0.5 * top) & (others.isna() | (values >= LOCAL_RATIO * others))]
    if len(holds) > max(1, len(values) // LOCAL_SHARE):
        return []
    return list(holds.sort_values(ascending=False, kind="stable").index)


def check(w: WindowContext) -> Detection | None:
    nw, g, base = w.node, w.cluster, w.baseline
    loss_nodes = nw["loss_rate"].fillna(0)
    rdma_loss = bool(len(loss_nodes)) and float(loss_nodes.max()) >= LOSS_RATE
    ratio = float(np.nan_to_num(g["retrans_ratio"]))
    node_ratio = nw["retrans_ratio"]
    tcp_local = _local(node_ratio.where(node_ratio >= RETRANS_NODE, 0.0)) if node_ratio.notna().any() else []
    tcp_loss = bool(tcp_local) or ratio >= RETRANS_RATIO or (
        np.isfinite(base.retrans_ratio) and ratio >= max(RETRANS_RISE * base.retrans_ratio, RETRANS_FLOOR))
    if not (rdma_loss or tcp_loss) or not w.impact:
        return None
    # Localised when the loss concentrates on a few nodes far above their peers. A bad cable
    # or optic is lossy both ways, so its node's neighbours in the collective count loss
    # too; the port that receives corrupted frames (CRC/symbol errors) is the one to fix.
    culprits = _local(loss_nodes) if rdma_loss else (tcp_local or _local(node_ratio))
    # (On 2 or 3 nodes every node sees about as much loss: the errors alone name the port.)
    erring = _local(nw["rx_error_rate"]) if "rx_error_rate" in nw else []
    if len(culprits) > 1:
        culprits = [n for n in erring if n in culprits] or culprits
    elif not culprits and rdma_loss:
        culprits = [n for n in erring if loss_nodes.get(n, 0) > 0]
    severe = w.excess >= 2 * EXCESS_IDLE if w.has_gpu else False
    evidence: dict[str, object] = {"loss_events_per_s": float(loss_nodes.sum()), "tcp_retransmit_ratio": ratio}
    if culprits:
        evidence["node_" + ("loss_events_per_s" if rdma_loss else "tcp_retransmit_ratio")] = \
            against_peers(loss_nodes if rdma_loss else node_ratio, culprits)
    evidence["gpu_idle"] = g["idle_frac"]
    figure = loss_nodes if rdma_loss else node_ratio
    return Detection(culprits, w.devices(culprits, "loss_rate") if rdma_loss else [], 0.6 + 0.3 * severe, evidence,
                     effect={n: float(figure[n]) for n in culprits})


def signature(node: pd.DataFrame) -> pd.Series:
    by = node.groupby(level="window")
    return by["loss_rate"].max().ge(LOSS_RATE) | by["retrans_ratio"].max().ge(RETRANS_NODE)


RULE = BottleneckClass(
    name="packet_loss",
    title="Packet loss",
    confirm=('sum by (instance) (rate(gpunet_nic_rdma_loss_events_total{instance=~"$NODES"}[5m]))\n'
             'or sum by (instance) (rate(gpunet_tcp_retransmitted_segments_total{instance=~"$NODES"}[5m]))'),
    remediation=(
        "Go-back-N retransmission (RoCE) or TCP retransmits are stalling the collectives. RoCE needs a "
        "lossless fabric: check PFC on the RoCE priority at every hop and the switch buffer drops. On the "
        "named nodes' links check CRC/symbol errors (a cable or optic going bad), FEC mode, and MTU mismatches "
        "along the path."),
    check=check,
    localised=True,
    # Retransmission timeouts leave the wire quiet and the fabric's recovery marks packets.
    explains=frozenset({"network_congestion", "host_bound"}),
    chart=("loss_rate", "RDMA loss events per second"),
    signature=signature,
)
