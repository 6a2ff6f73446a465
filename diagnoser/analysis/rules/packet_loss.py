"""packet_loss: go-back-N retransmission (RDMA loss events), or TCP retransmits where the
collectives run over TCP sockets, stall the collectives. Loss counts as the cause only where
a node's count stands out from what its peers' rate predicts (or the job's from its own
usual rate) and the job's throughput falls with it; loss that follows congestion's marks
and pauses is congestion's symptom."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnoser.analysis.rules import counts
from diagnoser.analysis.rules.base import EXCESS_IDLE, BottleneckClass, Detection, WindowContext, tcp_share

# Go-back-N events per second on the lossy node: below one a second, each event costs the
# collective a retransmitted window (tens of microseconds) and no measurable time. The bar is
# the worst node's count, not the job's mean: a bad cable or optic is one link's loss, and
# stalls every collective through that node however many healthy nodes share the job.
LOSS_RATE = 1.0
# A node holds the loss when its count is ten times what its peers' rate predicts for the
# bytes it moved (and significantly so, rules/counts.py): one bad cable or optic. Nodes'
# backgrounds differ by a few times (their place in the fabric); a failing link by orders.
LOCAL_RATIO = 10.0
LOCAL_SHARE = 4  # at most one node in this many: loss on more is the fabric's, not a node's
# The whole job's loss against its own quieter windows (loss spread over the fabric: a switch
# dropping, a misconfigured lossless class): ten times its usual count per byte.
FABRIC_RISE = 10.0
# TCP retransmits are a cause only where TCP carries the training traffic (NCCL over
# sockets): where the collectives run over RDMA, TCP carries management traffic whose
# retransmits cannot make a GPU wait. A share of the bytes sent this large (counted at the
# smallest segment size, so at least this) is no management traffic, which moves megabytes
# a second beside the fabric's gigabytes.
TCP_CARRIES_TRAINING = 0.05
RETRANS_RATIO = 0.005  # TCP retransmitted / sent segments over the job; datacentre TCP sits below 0.1%
# ... or ten times the job's own background: in a collective every lost tail segment can
# cost a retransmission timeout (200 ms minimum on Linux), so even rare loss stalls it.
RETRANS_RISE = 10.0
# A node's own TCP retransmit ratio that counts, where its count stands out from its peers':
# on a node of a synchronous job 0.01% already means a retransmission timeout every few seconds.
RETRANS_NODE = 1e-4
# Loss that costs the job time costs it throughput: the median node's load must be below its
# best windows' (Baseline.util_top) by at least this much.
THROUGHPUT_FALL = 0.02


def _local(table: pd.DataFrame) -> list[str]:
    """The nodes whose counts stand out (counts.against_background), worst first; none where
    more than one node in LOCAL_SHARE does (loss spread over the job is the fabric's)."""
    holds = table[table["holds"]]
    if not len(holds) or len(holds) > max(1, len(table) // LOCAL_SHARE):
        return []
    return list(holds.sort_values("ratio", ascending=False, kind="stable").index)


def check(w: WindowContext) -> Detection | None:
    nw, g, base = w.node, w.cluster, w.baseline
    if not w.impact or not len(nw):
        return None
    seconds = pd.Series(w.step, index=nw.index)
    # Loss events per byte moved: a node that moves more meets more loss on the same fabric.
    # Where some node's bytes are unknown, per second for all.
    exposure = nw["bytes_moved"] if bool((nw["bytes_moved"] > 0).all()) else seconds
    loss = counts.against_background(nw["rdma_loss"], exposure, LOCAL_RATIO, at_least=LOSS_RATE * w.step)
    rdma_local = _local(loss)
    total_loss = float(nw["rdma_loss"].sum(min_count=1)) if nw["rdma_loss"].notna().any() else float("nan")
    _, loss_p, fabric_rise = counts.job_excess(total_loss, float(g.get("gb_moved", np.nan)), base.loss_per_gb,
                                               FABRIC_RISE)
    rdma_fabric = fabric_rise and bool(float(nw["rdma_loss"].max()) >= LOSS_RATE * w.step)
    tcp_training = bool(np.isfinite(base.tcp_byte_share) and base.tcp_byte_share >= TCP_CARRIES_TRAINING)
    tcp_local: list[str] = []
    tcp_fabric = False
    tcp = pd.DataFrame()
    if tcp_training and nw["tcp_retrans"].notna().any():
        tcp = counts.against_background(nw["tcp_retrans"], nw["tcp_sent"], LOCAL_RATIO)
        own = nw["tcp_retrans"] / nw["tcp_sent"].where(nw["tcp_sent"] > 0)
        tcp["holds"] &= (own >= RETRANS_NODE).reindex(tcp.index, fill_value=False)
        tcp_local = _local(tcp)
        ratio = float(np.nan_to_num(g["retrans_ratio"]))
        sent = float(nw["tcp_sent"].sum())
        retrans = float(nw["tcp_retrans"].sum())
        background = base.retrans_ratio if np.isfinite(base.retrans_ratio) else 0.0
        _, _, rise = counts.job_excess(retrans, sent, background, RETRANS_RISE)
        tcp_fabric = rise and (ratio >= RETRANS_RATIO or ratio >= RETRANS_RISE * background)
    if not (rdma_local or rdma_fabric or tcp_local or tcp_fabric):
        return None
    # Loss that does not slow the job's traffic is not what its GPUs wait for.
    if np.isfinite(base.util_top) and np.isfinite(g["util_median"]) and \
            g["util_median"] > (1 - THROUGHPUT_FALL) * base.util_top:
        return None
    rdma = bool(rdma_local or rdma_fabric)
    culprits = rdma_local if rdma else tcp_local
    # A bad cable or optic is lossy both ways, so its node's neighbours in the collective count
    # loss too (NAKs, timeouts: on a ring, every node whose traffic crosses the link); the port
    # that receives corrupted frames (CRC/symbol errors) is the one to fix, where its errors
    # stand out as a count and the node counts loss of its own.
    errors = counts.against_background(nw["rx_errors"], seconds, LOCAL_RATIO, at_least=1.0) \
        if "rx_errors" in nw and nw["rx_errors"].notna().any() else pd.DataFrame(columns=["holds"])
    erring = list(errors.index[errors["holds"].astype(bool)])
    if len(culprits) > 1:
        culprits = [n for n in culprits if n in erring] or culprits
    elif not culprits and rdma:
        lossy = loss.index[loss["count"].fillna(0) >= LOSS_RATE * w.step]
        culprits = [n for n in erring if n in lossy]
    # Congestion's marks and pauses explain the loss that follows them (buffers overflow where
    # the fabric is congested): what is left to report is a link that corrupts frames.
    cause = w.cause_found("packet_loss")
    if cause is not None:
        culprits = [n for n in culprits if n in erring]
        if not culprits:
            return Detection([], [], 0.0, {}, suppressed_by=cause)
    table = loss if rdma else tcp
    severe = w.excess >= 2 * EXCESS_IDLE if w.has_gpu else False
    evidence: dict[str, object] = {"loss_events_per_s": float(np.nan_to_num(total_loss)) / w.step,
                                   "tcp_retransmit_ratio": g["retrans_ratio"]}
    if culprits:
        evidence["node_" + ("loss_events" if rdma else "tcp_retransmits")] = counts.evidence(table, culprits)
    elif rdma:
        evidence["job_loss_events_p_value"] = loss_p
    if not rdma:
        evidence["tcp_share_of_bytes_sent"] = base.tcp_byte_share
    evidence["gpu_idle"] = g["idle_frac"]
    figure = nw["rdma_loss"] if rdma else nw["tcp_retrans"]
    return Detection(culprits, w.devices(culprits, "loss_rate") if rdma else [], 0.6 + 0.3 * severe, evidence,
                     effect={n: float(figure[n]) for n in culprits})


def signature(node: pd.DataFrame) -> pd.Series:
    tcp_training = tcp_share(node["tcp_sent"], node["bytes_sent"]) >= TCP_CARRIES_TRAINING
    lossy = (node["loss_rate"] >= LOSS_RATE) | ((node["retrans_ratio"] >= RETRANS_NODE) & tcp_training)
    return lossy.groupby(level="window").any()


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
    # Retransmission timeouts leave the wire quiet. (Not congestion: the fabric's marks and
    # pauses come first and explain the loss, network_congestion's record says.)
    explains=frozenset({"host_bound"}),
    after=("pfc_storm", "link_degraded", "network_congestion"),
    chart=("loss_rate", "RDMA loss events per second"),
    signature=signature,
)
