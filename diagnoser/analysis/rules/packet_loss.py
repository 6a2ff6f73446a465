"""packet_loss: go-back-N retransmission (RDMA loss events) or TCP retransmits stall the
collectives."""

from __future__ import annotations

import numpy as np

from diagnoser.analysis.rules.base import EXCESS_IDLE, BottleneckClass, Detection, WindowContext

# Go-back-N events per second per node; a clean fabric has none for hours.
LOSS_RATE = 1.0
RETRANS_RATIO = 0.005  # TCP retransmitted / sent segments; datacentre TCP sits below 0.1%
# ... or ten times the job's own background: in a collective every lost tail segment can
# cost a retransmission timeout (200 ms minimum on Linux), so even rare loss stalls it.
RETRANS_RISE = 10.0
RETRANS_FLOOR = 1e-5
LOCAL_Z = 5.0  # a node this far above its peers' median holds the problem
LOCAL_SHARE = 0.7  # ... or, in a job too small for peer statistics, holds this share of it


def check(w: WindowContext) -> Detection | None:
    nw, g, base = w.node, w.cluster, w.baseline
    loss_nodes = nw["loss_rate"].fillna(0)
    rdma_loss = float(loss_nodes.sum()) / max(len(nw), 1) >= LOSS_RATE
    ratio = float(np.nan_to_num(g["retrans_ratio"]))
    tcp_loss = ratio >= RETRANS_RATIO or (
        np.isfinite(base.retrans_ratio) and ratio >= max(RETRANS_RISE * base.retrans_ratio, RETRANS_FLOOR))
    if not (rdma_loss or tcp_loss) or not w.impact:
        return None
    # Localised when the loss concentrates: a few nodes far above their peers, or one node
    # holding most of it.
    values, z = (loss_nodes, nw["loss_rate_z"]) if rdma_loss else (nw["retrans_ratio"].fillna(0),
                                                                    nw["retrans_ratio_z"])
    total = float(values.sum())
    share = values / total if total > 0 else values * 0
    local = values[((z >= LOCAL_Z) | (share >= LOCAL_SHARE)) & (values >= 0.5 * values.max())]
    culprits = list(local.sort_values(ascending=False).index) if 0 < len(local) <= max(1, len(nw) // 4) else []
    severe = w.excess >= 2 * EXCESS_IDLE if w.has_gpu else False
    return Detection(culprits, w.devices(culprits, "loss_rate") if rdma_loss else [], 0.6 + 0.3 * severe, {
        "loss_events_per_s": float(loss_nodes.sum()), "tcp_retransmit_ratio": g["retrans_ratio"],
        "gpu_idle": g["idle_frac"]})


RULE = BottleneckClass(
    name="packet_loss",
    title="Packet loss",
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
)
