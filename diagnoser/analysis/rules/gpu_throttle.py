"""gpu_throttle: some nodes' GPUs are clock-throttled and the rest of the job waits for them."""

from __future__ import annotations

import pandas as pd

from diagnoser.analysis.rules.base import MIN_PEERS, BottleneckClass, Detection, WindowContext, against_peers, any_node

THROTTLE = 0.25  # fraction of a node's GPU time under a throttle reason
# ... beyond what the job's least throttled nodes spend (its 10th percentile: the nodes that
# wait, robust to one odd node among ten): they wait for a node in proportion to how much
# more it throttles than they do. A
# fleet-wide power cap slows every node alike and makes none wait (their GPUs are busy,
# only slower): no finding, and no node set aside from the straggler and host_bound rules.
# Without a rise of the job's idle, a throttled node still counts when it idles far less
# than its peers (robust z): the others are waiting for it.
WAITED_FOR_Z = -2.0
WAITED_FOR_GAP = 0.03  # idle fraction below the others', where too few nodes for a z-score


def check(w: WindowContext) -> Detection | None:
    nw = w.node
    share = nw["throttle_frac"]
    # On fewer nodes than a spread needs, the share alone (one node's peers are too few to say).
    floor = share.quantile(0.1) if len(nw) >= MIN_PEERS else 0.0
    throttled = nw[(share >= THROTTLE) & (share - floor >= THROTTLE)]
    if not len(throttled):
        return None
    # On fewer nodes than a spread needs, waited for = idling clearly less than the others.
    waited_for = (throttled["idle_frac_z"] <= WAITED_FOR_Z) if len(nw) >= MIN_PEERS else (
        throttled["idle_frac"] <= nw["idle_frac"].drop(index=throttled.index).median() - WAITED_FOR_GAP)
    if not (w.impact or waited_for.any()):
        return None
    culprits = list(throttled["throttle_frac"].sort_values(ascending=False).index)
    return Detection(culprits, [], 0.7 + 0.25 * min(throttled["throttle_frac"].max(), 1.0), {
        "throttled_fraction": against_peers(nw["throttle_frac"], culprits),
        "throttled_gpus": throttled_gpus(w.gpu, w.window, w.step, culprits),
        "sm_clock_mhz": {n: nw.at[n, "sm_clock"] / 1e6 for n in culprits}, "gpu_idle": w.cluster["idle_frac"]},
        effect={n: float(nw.at[n, "throttle_frac"]) for n in culprits})


def throttled_gpus(gpu: pd.DataFrame, window: float, step: float, nodes: list[str]) -> dict[str, str]:
    """Which GPUs of the culprit nodes were throttled in the window, where the source gives GPUs."""
    if not len(gpu):
        return {}
    try:
        gpu = gpu.xs(window, level="window")
    except KeyError:
        return {}
    out = {}
    for node in nodes:
        if node in gpu.index.get_level_values("instance"):
            rows = gpu.xs(node, level="instance")
            gpus = rows.index[(rows["throttled"] / step) >= THROTTLE]
            out[node] = ",".join(sorted(gpus, key=lambda g: (len(g), g))) or "none above the threshold alone"
    return out


RULE = BottleneckClass(
    name="gpu_throttle",
    title="GPU throttling",
    confirm='max by (instance, reason) (rate(gpunet_gpu_throttled_seconds_total{instance=~"$NODES"}[5m]))',
    remediation=(
        "The named nodes' GPUs are clock-throttled and the rest of the job waits for them. Check cooling "
        "(inlet temperature, fans, airflow), power capping and the power brake (nvidia-smi -q -d PERFORMANCE), "
        "and drain the node if it cannot hold its clocks."),
    check=check,
    localised=True,
    needs_gpu=True,
    # The throttled node is the slow one its peers wait for, and their wait exposes the
    # all-reduce at line rate.
    explains=frozenset({"straggler", "network_bandwidth"}),
    chart=("throttle_frac", "fraction of GPU time throttled"),
    signature=lambda node: any_node(node, "throttle_frac", THROTTLE),
)
