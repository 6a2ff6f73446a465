"""straggler: some nodes compute slower, with no throttle or network cause of their own."""

from __future__ import annotations

from diagnoser.analysis.rules.base import MIN_PEERS, BottleneckClass, Detection, WindowContext, against_peers

STRAGGLER_Z = -4.0  # a node idles far less than its peers (robust z): the others wait for it
STRAGGLER_GAP = 0.03  # ... by at least this much idle fraction
MAX_SHARE = 4  # at most one node in this many: a quarter of the job slower is not "a straggler"
# Over the window and its neighbours a straggler still idles less than its peers: one slow
# for a single window keeps a third of its gap (half at the first or last window), so a
# quarter leaves a margin. A node that only seemed to idle less because its scrapes put part
# of a cluster-wide stall in the next window gives it all back there.
SPAN_GAP = STRAGGLER_GAP / 4
# A node whose busy and idle seconds cover more or less of the window than its GPUs' time
# (a scrape missing at the window's edge, an exporter restart: its counts moved to the next
# window or lost) has an idle share of another span than its peers': beside a checkpoint's
# stall it seems to idle less only by that. Such a window says nothing of its pace.
COVERAGE_SLACK = 0.1


def check(w: WindowContext) -> Detection | None:
    nw = w.node
    if len(nw) < MIN_PEERS:  # "slower than its peers" needs peers (the report says so)
        return None
    idle = nw["idle_frac"]
    median_idle = idle.median()
    is_slow = (nw["idle_frac_z"] <= STRAGGLER_Z) & (idle <= median_idle - STRAGGLER_GAP)
    span = nw["idle_frac_span"]
    is_slow &= span.isna() | (span <= span.median() - SPAN_GAP)  # an unknown span: the window alone
    if "coverage" in nw:
        is_slow &= (nw["coverage"] - 1).abs() <= COVERAGE_SLACK
    if not is_slow.any():
        return None
    # A stall of the whole fabric (a storm: every GPU waits, paused) leaves no node's pace to
    # compare: who seems to idle less is an artefact of when its scrapes caught the stall.
    stall = next((c for c in sorted(w.found) if "straggler" in w.explains.get(c, ()) and w.waits_in.get(c) == "paused"),
                 None)
    if stall is not None:
        return Detection([], [], 0.0, {}, suppressed_by=stall)
    slow = nw[is_slow]
    # A node with a cause of its own found in this window (a throttle, a bad link, loss, a
    # storm) is that cause's culprit, not a straggler.
    explained = {n for d in w.found.values() for n in d.nodes}
    slow = slow[~slow.index.isin(list(explained))]
    if not len(slow) or not w.impact or len(slow) > max(1, len(nw) // MAX_SHARE):
        return None
    culprits = list(slow["idle_frac"].sort_values().index)
    return Detection(culprits, [], 0.6 + 0.3 * min(-slow["idle_frac_z"].min() / 10, 1.0), {
        "node_gpu_idle": against_peers(nw["idle_frac"], culprits),
        "gpu_idle": w.cluster["idle_frac"]},
        effect={n: float(median_idle - nw.at[n, "idle_frac"]) for n in culprits})


RULE = BottleneckClass(
    name="straggler",
    title="Straggler node",
    confirm='avg by (instance) (rate(gpunet_gpu_busy_seconds_total[5m]))',
    remediation=(
        "The named nodes compute slower with no throttle or network cause visible. Check CPU frequency and "
        "data-loader NUMA affinity, other processes on the node, GPU PCIe link width, memory errors (ECC, "
        "row remapping); replace the node in the job if it persists."),
    check=check,
    localised=True,
    needs_gpu=True,
    after=("pfc_storm", "link_degraded", "packet_loss", "gpu_throttle"),
    explains=frozenset({"network_bandwidth"}),  # the others' wait exposes their all-reduce
    chart=("idle_frac", "GPU idle fraction"),
    nccl_signal="late",  # a rank that enters the collectives late: the others wait in them
)
