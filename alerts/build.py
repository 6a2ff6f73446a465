"""Generate the Prometheus alerting and recording rules (alerts/gpunet.rules.yml) from one
source, with the settings a monitoring mixin takes:

    python alerts/build.py                       # rewrite alerts/gpunet.rules.yml (the default build)
    python alerts/build.py --check               # exit 1 if the committed file differs
    python alerts/build.py --selector 'job="gpunet-exporter"' --cluster-label region \\
        --rate-interval 2m --short-rate-interval 4m \\
        --runbook-url-base https://docs.example.org/gpunet/runbook.md --out my.rules.yml
    python alerts/build.py --runbook-url-pattern 'https://wiki.example.org/gpunet/%s' ...  # a page per alert

Conventions (the monitoring-mixins style guide, as node-mixin and kube-prometheus follow it):
- severities `critical` (page someone now), `warning` (a ticket, during working hours) and
  `info` (context for other alerts, routed nowhere by default);
- `summary` is static, so grouped notifications share one headline; the instance, device
  and value go in `description`;
- `runbook_url` is the base (`--runbook-url-base`, where you host docs/runbook.md) + `#` +
  the alert's name in lower case, a section of docs/runbook.md; or, as the mixins'
  `runbookURLPattern`, `--runbook-url-pattern` with `%s` for that name. The default build
  links `docs/runbook.md#<alert>`, relative to the gpunet source tree: it names the section
  and points at no web address gpunet does not have; build with the base where you publish
  docs/runbook.md (docs/deploy.md, "Alert runbook links") for links that open;
- every selector carries `--selector`; aggregations keep the `--cluster-label` (and any
  other target label) by aggregating `without` the labels they remove, and `on (...)`
  joins name it;
- recording rules are named level:metric:operations, the level being the labels they keep
  (instance_device:..., job:...).

Every alert's threshold and what to do are in docs/runbook.md; alerts/tests/*.yml are the
promtool unit tests (run against the default build); deploy/alertmanager/ routes them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "gpunet.rules.yml"

# XIDs (NVIDIA's catalogue) that mean the GPU, its memory, NVLink or the driver failed: the
# node's job is dead or will be. Others are mostly the application's own doing (13 graphics
# engine exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive cleanup):
# worth knowing (info), not waking anyone.
XID_HARDWARE = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)


@dataclass(frozen=True)
class Settings:
    selector: str = 'job=~"gpunet.*"'
    cluster_label: str = "cluster"
    rate_interval: str = "5m"
    # Where docs/runbook.md is published (absolute: Alertmanager and Grafana show the link as
    # is). The default is the file's path in the source tree, not an address: see the module doc.
    runbook_url_base: str = "docs/runbook.md"
    # The window of the records that must react within minutes (GpunetPfcStorm's): at least
    # 4 scrape intervals, so that one missed scrape leaves 2 samples in it (4m at a 60 s scrape).
    short_rate_interval: str = "2m"
    # The mixins' runbookURLPattern: `%s` is the alert's name in lower case. Set, it wins over
    # the base (a wiki with a page per alert).
    runbook_url_pattern: str = ""
    # The diagnoser service (`diagnose serve`): its scrape job, the address where on-call opens
    # its reports (its --external-url), and its --max-data-age (GpunetDiagnoserBlind's limit).
    diagnoser_selector: str = 'job="gpunet-diagnoser"'
    diagnoser_url: str = "http://gpunet-diagnoser.gpunet.svc:9846"
    diagnoser_max_data_age: str = "5m"
    # The diagnoser's per-node records (group gpunet.diagnoser.records): how often they are
    # evaluated (at least the scrape interval; a diagnosis's windows are at least 4 of these,
    # so your scrape interval gives the windows the raw series give), and how far back each
    # looks for a counter's sample before (at least 2 scrape intervals: one missed scrape
    # loses nothing).
    records_interval: str = "1m"
    records_lookback: str = "2m"

    def runbook_url(self, alert: str) -> str:
        anchor = alert.lower()
        return self.runbook_url_pattern.replace("%s", anchor) if self.runbook_url_pattern else \
            f"{self.runbook_url_base}#{anchor}"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    severity: str  # critical | warning | info
    summary: str  # static: no templates
    description: str
    for_: str | None = None
    comment: str = ""
    links: tuple[tuple[str, str], ...] = ()  # more annotations: (name, URL template)


@dataclass(frozen=True)
class Record:
    name: str
    expr: str
    comment: str = ""


def rules(s: Settings) -> list[tuple[str, list[Record | Alert]]]:
    def m(metric: str, matchers: str = "") -> str:
        """A metric with the selector (and more matchers)."""
        inner = ", ".join(x for x in (s.selector, matchers) if x)
        return f"{metric}{{{inner}}}"

    c = s.cluster_label
    nic = f"{c}, job, instance, device"  # what names one NIC everywhere
    r, short = s.rate_interval, s.short_rate_interval

    fabric = "instance_device:gpunet_nic_fabric:bool"
    tx_pauses = f"instance_device:gpunet_nic_pfc_transmit_pause_frames:rate{short}"
    rx_pauses = f"instance_device:gpunet_nic_pfc_receive_pause_frames:rate{r}"
    loss = f"instance_device:gpunet_nic_rdma_loss_events:rate{r}"
    credit_wait = f"instance_device:gpunet_nic_transmit_wait_ticks_per_byte:ratio_rate{r}"
    retransmits = f"instance:gpunet_tcp_retransmitted_segments:ratio_rate{r}"
    median_speed = "job:gpunet_nic_fabric_link_speed_bytes_per_second:median"
    idle_network = "instance:gpunet_gpu_idle_network_bound:ratio_avg_rate10m"
    throttled = f"instance_gpu:gpunet_gpu_throttled:ratio_max_rate{r}"
    xids = "|".join(map(str, XID_HARDWARE))
    with_rdma = 'rdma_device!=""'
    transmit, receive = 'direction="transmit"', 'direction="receive"'
    busy_network = 'network_state=~"saturated|paused"'
    hardware_xid, other_xid = f'xid=~"{xids}"', f'xid!~"{xids}"'
    uncorrected = 'type="uncorrected"'
    not_power_cap = 'reason!="sw_power_cap"'
    nvlink_data, nvlink_recovery = 'kind=~"crc_flit|crc_data|replay"', 'kind="recovery"'

    recording: list[Record | Alert] = [
        Record(fabric, f"{m('gpunet_nic_fabric')}\nor\nmax without (rdma_device, port, driver, link_layer, numa_node, "
                       f"pci_address) ({m('gpunet_nic_info', with_rdma)})",
               "1 for the NICs of the training fabric, 0 for the others. Exporters that export\n"
               "gpunet_nic_fabric decide it (RDMA NICs by default, or --fabric-devices); for older\n"
               "exporters and traces without it, a NIC with an RDMA device is fabric."),
        # A storm is detected on a short window on purpose (--short-rate-interval): it freezes the
        # fabric within seconds.
        Record(tx_pauses, f"sum without (direction, priority) "
                          f"(rate({m('gpunet_nic_pfc_pause_frames_total', transmit)}[{short}]))"),
        Record(rx_pauses, f"sum without (direction, priority) "
                          f"(rate({m('gpunet_nic_pfc_pause_frames_total', receive)}[{r}]))"),
        Record(loss, f"sum without (kind) (rate({m('gpunet_nic_rdma_loss_events_total')}[{r}]))"),
        Record(credit_wait, f"rate({m('gpunet_nic_transmit_wait_ticks_total')}[{r}])\n/ (\n"
                            f"  rate({m('gpunet_nic_transmit_bytes_total')}[{r}])\n"
                            f"  + rate({m('gpunet_nic_receive_bytes_total')}[{r}])\n  > 0\n)",
               "InfiniBand: ticks a port waited for credit per byte it moved (port_xmit_wait's tick is the\n"
               "HCA's own, so the ratio is compared with the same port's history, never with a constant).\n"
               "No sample while the port moves nothing (0/0 would poison the alert's 1-day quantile).\n"
               "Matched on all labels, not on (...): the three counters come from one scrape, and\n"
               "target labels (a Kubernetes pod) differ between the old and new exporter for 5 minutes\n"
               "after a restart, which an on (...) one-to-one match refuses."),
        Record(retransmits, f"rate({m('gpunet_tcp_retransmitted_segments_total')}[{r}]) / "
                            f"rate({m('gpunet_tcp_sent_segments_total')}[{r}])\n"
                            f"and rate({m('gpunet_tcp_sent_segments_total')}[{r}]) > 100"),
        Record(median_speed, f"quantile by ({c}, job) (0.5,\n"
                             f"  {m('gpunet_nic_link_speed_bytes_per_second')}\n"
                             f"  and on ({nic}) ({fabric} == 1)\n"
                             f"  and on ({nic}) ({m('gpunet_nic_up')} == 1))",
               f"Median negotiated speed of the job's fabric links that are up: by ({c}, job), since\n"
               "per-node target labels (Kubernetes' pod, node) would make it a median per node."),
        Record(idle_network, f"avg without (gpu) (\n  sum without (network_state) (rate("
                             f"{m('gpunet_gpu_idle_seconds_total', busy_network)}"
                             f"[10m])))",
               "Fraction of wall time a node's GPUs sat idle while its fabric was saturated or paused."),
        Record(throttled, f"max without (reason) (rate({m('gpunet_gpu_throttled_seconds_total')}[{r}]))",
               "Fraction of wall time the GPU's worst clock-event reason was active."),
    ]
    network = [
        Alert("GpunetPfcStorm", f"{tx_pauses} > 500", "critical", "A NIC transmits PFC pause frames without pause.",
              "{{ $labels.instance }} NIC {{ $labels.device }} has transmitted {{ $value | humanize }} PFC pause "
              "frames/s for over 2 minutes; it is freezing its switch port and, through pause propagation, its "
              "neighbours.", "2m"),
        Alert("GpunetPfcReceivePressure", f"{rx_pauses} > 100", "warning", "The fabric keeps pausing a NIC.",
              "{{ $labels.instance }} NIC {{ $labels.device }} receives {{ $value | humanize }} PFC pause frames/s "
              f"({r} average) for over 10 minutes: the switch keeps stopping its transmit queue.", "10m"),
        Alert("GpunetNetworkCongestion",
              f"rate({m('gpunet_nic_ecn_marked_packets_total')}[{r}]) > 5000\nor\n"
              f"rate({m('gpunet_nic_cnp_received_total')}[{r}]) > 2000",
              "warning", "Sustained ECN/CNP congestion on a fabric NIC.",
              "{{ $labels.instance }} NIC {{ $labels.device }} sees {{ $value | humanize }}/s ECN-marked packets or "
              f"CNPs ({r} average) for over 5 minutes: DCQCN is throttling its flows.", "5m"),
        Alert("GpunetInfinibandCongestion",
              f"{credit_wait}\n/ (quantile_over_time(0.2, {credit_wait}[1d:5m]) > 0)\n> 10",
              "warning", "An InfiniBand port waits for credit far more than it usually does.",
              "{{ $labels.instance }} NIC {{ $labels.device }} waited for credit {{ $value | humanize }} times as "
              f"long per byte moved ({r} average) as in its quieter periods of the last day, for over 5 minutes: "
              "the switches ahead of it are congested.", "5m",
              "Relative on purpose: port_xmit_wait counts in the HCA's own tick, and a healthy port\n"
              "waits briefly in every burst; ten times the port's own 20th percentile is congestion.\n"
              "A port that never waited has no baseline and stays silent."),
        Alert("GpunetRdmaLossEvents", f"{loss} > 10", "critical", "RDMA packet loss on a lossless fabric.",
              "{{ $labels.instance }} NIC {{ $labels.device }} triggers {{ $value | humanize }} go-back-N loss "
              "events/s (out-of-sequence, NAK sequence errors, ACK timeouts) for over 5 minutes on a fabric that "
              "should be lossless.", "5m"),
        Alert("GpunetTcpRetransmitRatio", f"{retransmits} > 0.01", "warning", "A node retransmits over 1% of its TCP "
              "segments.", "{{ $labels.instance }} retransmits {{ $value | humanizePercentage }} of its TCP segments "
              f"({r} average) for over 10 minutes.", "10m"),
    ]
    link = [
        Alert("GpunetFabricLinkDown",
              f"{m('gpunet_nic_up')} == 0\nand on ({nic}) ({fabric} == 1)\n"
              f"and on ({nic}) (max_over_time({m('gpunet_nic_up')}[6h]) == 1)",
              "critical", "A training-fabric link is down.",
              "{{ $labels.instance }} fabric NIC {{ $labels.device }} was up in the last 6 hours and has had no "
              "carrier or operstate up for over 1 minute.", "1m"),
        Alert("GpunetLinkFlapping", f"increase({m('gpunet_nic_carrier_changes_total')}[10m]) > 4", "critical",
              "A link keeps losing its carrier.",
              "{{ $labels.instance }} NIC {{ $labels.device }} changed carrier {{ $value | humanize }} times in "
              "10 minutes.", "1m"),
        Alert("GpunetLinkSpeedBelowPeers",
              f"(\n  {m('gpunet_nic_link_speed_bytes_per_second')}\n  < on ({c}, job) group_left ()\n"
              f"  (0.9 * {median_speed})\n)\nand on ({nic}) ({fabric} == 1)\nand on ({nic}) ({m('gpunet_nic_up')} == 1)",
              "warning", "A fabric link negotiated less than its peers.",
              "{{ $labels.instance }} fabric NIC {{ $labels.device }} negotiated {{ $value | humanize }}B/s, below "
              "90% of the median of the job's fabric links, for over 5 minutes; the whole job waits on it.", "5m"),
        Alert("GpunetNicPhyErrors",
              f"increase({m('gpunet_nic_symbol_errors_total')}[10m]) > 10\nor\n"
              f"increase({m('gpunet_nic_fec_uncorrectable_blocks_total')}[10m]) > 0",
              "warning", "A link's physical layer is degrading.",
              "{{ $labels.instance }} NIC {{ $labels.device }} counted {{ $value | humanize }} symbol errors or "
              "uncorrectable FEC blocks in 10 minutes, for 5 minutes: a cable, optic or connector is failing; "
              "it loses frames now and flaps soon.", "5m"),
    ]

    def new_xids(matchers: str) -> str:
        """XIDs counted in the last 10 minutes, including a {gpu, xid} series born in them (the
        exporter makes one at the first XID, already at 1: increase() never sees it). Born: no
        sample in the hour before those 10 minutes, so that a Prometheus restart or a scrape
        gap does not make old XIDs page again."""
        x = m("gpunet_gpu_xid_errors_total", matchers)
        return f"({x} > 0 unless last_over_time({x}[1h] offset 10m))\nor\n(increase({x}[10m]) > 0)"

    gpu = [
        Alert("GpunetGpusIdleNetworkBound", f"{idle_network} > 0.15", "warning",
              "GPUs wait on a saturated or paused network.",
              "The GPUs of {{ $labels.instance }} spent {{ $value | humanizePercentage }} of the last 10 minutes idle "
              "while the node's fabric was saturated or paused.", "10m"),
        Alert("GpunetGpuThrottled",
              f"max without (reason) (rate({m('gpunet_gpu_throttled_seconds_total', not_power_cap)}[{r}])) > 0.25",
              "warning", "A GPU is clock-throttled.",
              "GPU {{ $labels.gpu }} of {{ $labels.instance }} was throttled (thermal, hardware slowdown or power "
              "brake) {{ $value | humanizePercentage }} of the last " + r + "; in a synchronous job every other GPU "
              "waits for it.", "5m",
              "Not the software power cap: H100/H200 under a large training job sit at their power limit\n"
              "much of the time, by design. The record above still keeps every reason."),
        Alert("GpunetGpuXidErrors", new_xids(hardware_xid),
              "critical", "A GPU reported a hardware or driver XID error.",
              "GPU {{ $labels.gpu }} of {{ $labels.instance }} reported {{ $value | humanize }} XID {{ $labels.xid }} "
              "errors in the last 10 minutes (memory ECC, row remapping, NVLink, fallen off the bus, GSP): drain "
              "the node.", comment=f"Hardware and driver XIDs only ({', '.join(map(str, XID_HARDWARE))}); the "
                                   "rest are GpunetGpuXidOther.\n"
                                   "The exporter creates a {gpu, xid} series at its first event, already at 1, which\n"
                                   "increase() never sees: the first operand catches a series new in the last 10 minutes\n"
                                   "(its $value, the count since it appeared), increase() the older ones."),
        Alert("GpunetGpuXidOther", new_xids(other_xid),
              "info", "A GPU reported an XID error, mostly the application's own.",
              "GPU {{ $labels.gpu }} of {{ $labels.instance }} reported {{ $value | humanize }} XID {{ $labels.xid }} "
              "errors in the last 10 minutes: usually the application (a page fault, an engine exception); look "
              "if it repeats across nodes."),
        Alert("GpunetGpuLost", f"{m('gpunet_gpu_up')} == 0", "critical", "A GPU stopped answering NVML.",
              "NVML has not answered for GPU {{ $labels.gpu }} of {{ $labels.instance }} for over 1 minute.", "1m"),
        Alert("GpunetGpuRowRemapFailed", f"{m('gpunet_gpu_row_remap_failed')} == 1", "critical",
              "A GPU has no spare memory row left.",
              "GPU {{ $labels.gpu }} of {{ $labels.instance }} failed to remap a memory row: it has no spare left "
              "and will keep raising memory errors. Drain the node and replace the GPU.", "1m"),
        Alert("GpunetGpuRowRemapPending", f"{m('gpunet_gpu_row_remap_pending')} == 1", "warning",
              "A GPU waits for a reset to remap a memory row.",
              "GPU {{ $labels.gpu }} of {{ $labels.instance }} has a memory row remapping pending for 15 minutes: it "
              "takes effect at the next GPU reset; reset it when its job ends.", "15m"),
        Alert("GpunetGpuUncorrectableEccErrors",
              f"increase({m('gpunet_gpu_ecc_errors_total', uncorrected)}[10m]) > 0", "warning",
              "A GPU had uncorrectable memory errors.",
              "GPU {{ $labels.gpu }} of {{ $labels.instance }} had {{ $value | humanize }} uncorrectable ECC errors "
              "in the last 10 minutes; the job on it most likely failed (XID 48, 94 or 95 pages for that).",
              comment="The XIDs the same errors raise page (GpunetGpuXidErrors); this one keeps the count."),
        Alert("GpunetGpuNvlinkErrors",
              f"sum without (kind) (rate({m('gpunet_gpu_nvlink_errors_total', nvlink_data)}[{r}])) > 10\nor\n"
              f"sum without (kind) (increase({m('gpunet_gpu_nvlink_errors_total', nvlink_recovery)}[10m])) > 0",
              "warning", "A GPU's NVLinks keep retrying or retraining.",
              "GPU {{ $labels.gpu }} of {{ $labels.instance }} sees {{ $value | humanize }} NVLink CRC errors and "
              "replays per second, or link recoveries, for 5 minutes: collectives over NVLink slow down and the "
              "link may fail.", "5m"),
    ]
    config = [
        Alert("GpunetEcnOffOnPfcPriority",
              f"({m('gpunet_nic_pfc_enabled')} == 1)\nand on ({nic}, priority)\n"
              f"(min without (point) ({m('gpunet_nic_ecn_enabled')}) == 0)",
              "warning", "PFC is on without ECN on a priority.",
              "{{ $labels.instance }} NIC {{ $labels.device }} has PFC enabled on priority {{ $labels.priority }} but "
              "RoCE congestion control (ECN/DCQCN) off at the notification or reaction point: pauses become the "
              "only brake on congestion (PFC storms, head-of-line blocking).", "15m",
              comment="Configuration facts change when someone changes them (a driver reload, a reboot\n"
                      "into defaults, a reseated card), so these alerts wait 15 minutes and open tickets."),
        Alert("GpunetNicPcieLinkDegraded",
              f"({m('gpunet_nic_pcie_max_link_width')} - {m('gpunet_nic_pcie_current_link_width')} > 0)\nor\n"
              f"({m('gpunet_nic_pcie_max_link_transfers_per_second')} - "
              f"{m('gpunet_nic_pcie_current_link_transfers_per_second')} > 0)",
              "warning", "A NIC's PCIe link trained below its capability.",
              "{{ $labels.instance }} NIC {{ $labels.device }} trained its PCIe link below what the card and its slot "
              "support (lanes or transfer rate) for 15 minutes: the host side may not keep up with the wire.", "15m"),
        Alert("GpunetGpuPcieWidthDegraded",
              f"{m('gpunet_gpu_pcie_max_link_width')} - {m('gpunet_gpu_pcie_current_link_width')} > 0",
              "warning", "A GPU's PCIe link is narrower than it supports.",
              "GPU {{ $labels.gpu }} of {{ $labels.instance }} runs {{ $value }} PCIe lanes fewer than it and its slot "
              "support, "
              "for 15 minutes: host-device copies and GPUDirect RDMA through it are slower.", "15m",
              comment="Width only: GPUs lower their PCIe transfer rate when idle, by design."),
        Alert("GpunetBondMemberDown", f"{m('gpunet_bond_member_up')} == 0", "warning", "A bond member is down.",
              "Member {{ $labels.device }} of bond {{ $labels.bond }} on {{ $labels.instance }} has had MII status "
              "down for 5 minutes: the bond runs on fewer links than it has.", "5m"),
    ]
    exporter = [
        Alert("GpunetExporterDown", f"up{{{s.selector}}} == 0", "warning", "A gpunet exporter cannot be scraped.",
              "Prometheus has failed to scrape the gpunet exporter of {{ $labels.instance }} (job {{ $labels.job }}) "
              "for over 2 minutes: the node's NICs and GPUs are unwatched.", "2m"),
        Alert("GpunetCollectorDown", f"{m('gpunet_exporter_collector_up')} == 0", "warning",
              "A gpunet collector cannot read its sources.",
              "The {{ $labels.collector }} collector of the gpunet exporter on {{ $labels.instance }} has not read "
              "all its sources for over 5 minutes; its metrics are missing or stale.", "5m",
              comment="A host without the NVIDIA driver runs no GPU collector (the exporter turns them off), so\n"
                      "a GPU collector down is a GPU node whose driver or NVML fails."),
        Alert("GpunetExporterTicksLate",
              f"rate({m('gpunet_exporter_ticks_late_total')}[{r}])\n/\nrate({m('gpunet_exporter_ticks_total')}[{r}]) > 0.1",
              "warning", "A gpunet exporter's ticks overrun their interval.",
              "{{ $value | humanizePercentage }} of the {{ $labels.tick }} ticks of the gpunet exporter on "
              "{{ $labels.instance }} have started late, for over 15 minutes: its reads take longer than the "
              "tick's interval, so each tick sees the node later than it should (fast ticks: GPU idle time is "
              "split by network states read late).", "15m",
              comment="A tick starts late when the one before took longer than the interval. A late tick now and\n"
                      "then (a busy host) is normal; a tenth of them for 15 minutes is a source too slow for the\n"
                      "interval (an mlx5 port's ethtool statistics ask its firmware) or a CPU limit too low."),
    ]
    return with_diagnoser(s, [("gpunet.recording", recording), ("gpunet.network", network), ("gpunet.link", link),
                              ("gpunet.gpu", gpu), ("gpunet.config", config), ("gpunet.exporter", exporter)])


# ---------------------------------------------------------------- the diagnoser service
# `diagnose serve` publishes its findings as series (docs/oncall.md); these rules page with the
# cause it names, and say when it cannot see. Its series carry `workload` (the training job),
# never the exporters' job/instance, which are the service's own scrape target.

# Classes whose cause stops the whole job, or nearly, until someone acts: a storming NIC
# freezes the fabric (pause propagation), a link down or flapping stops or retrains the rail
# every collective crosses, RDMA loss on a lossless fabric stalls go-back-N for whole
# timeouts. They page (critical). The others slow the job without stopping it, or are
# chronic (a throttled GPU, a straggler, congestion, links too slow, input-bound hosts):
# a ticket (warning).
STALLING_CLASSES = ("pfc_storm", "link_degraded", "packet_loss")

# The per-node alerts that a diagnosed cause explains: their nodes are the victims. They get
# the node's `workload` (the one holding most of its GPUs) so that Alertmanager mutes them
# while a GpunetDiagnosisFinding of that workload fires (deploy/alertmanager/alertmanager.yml).
VICTIM_SYMPTOMS = ("GpunetGpusIdleNetworkBound", "GpunetPfcReceivePressure", "GpunetNetworkCongestion",
                   "GpunetInfinibandCongestion")


def seconds(duration: str) -> int:
    """'5m' -> 300: a PromQL duration as the number a comparison needs."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return int(float(duration[:-1]) * units[duration[-1]])
    except (KeyError, ValueError, IndexError):
        raise ValueError(f"duration {duration!r}: not a number followed by s, m, h or d") from None


def with_diagnoser(s: Settings, groups: list[tuple[str, list[Record | Alert]]]) -> list[tuple[str, list[Record | Alert]]]:
    """The groups, with the victims' symptom alerts labelled by workload, and the diagnoser's group."""
    from dataclasses import replace

    target = f"{s.cluster_label}, job, instance"
    info = f"gpunet_gpu_workload_info{{{s.selector}}}"
    # Adding 0 keeps the alert's value; topk picks one workload for a node two workloads share.
    workload_of = f"0 * topk by ({target}) (1, count by ({target}, workload) ({info}))"

    def labelled(item: Record | Alert) -> Record | Alert:
        if not isinstance(item, Alert) or item.name not in VICTIM_SYMPTOMS:
            return item
        body = "\n".join("  " + line for line in item.expr.splitlines())
        expr = (f"(\n{body}\n)\n+ on ({target}) group_left (workload)\n  {workload_of}\n"
                f"or\n(\n{body}\n)\nunless on ({target}) {info}")
        note = ("The node's workload is added where the exporter knows it (gpunet_gpu_workload_info),\n"
                "so that a diagnosed cause of that workload mutes this alert in Alertmanager.")
        return replace(item, expr=expr, comment=f"{item.comment}\n{note}" if item.comment else note)

    return [(name, [labelled(i) for i in items]) for name, items in groups] + [("gpunet.diagnoser.alerts", diagnoser(s))]


def diagnoser(s: Settings) -> list[Record | Alert]:
    d = s.diagnoser_selector
    age = seconds(s.diagnoser_max_data_age)
    stalling = "|".join(STALLING_CLASSES)
    report = ("report_url", f"{s.diagnoser_url}/reports/latest?job={{{{ $labels.workload | urlquery }}}}")

    def finding(classes: str) -> str:
        return f"gpunet_diagnosis_finding{{{d}, {classes}}}"

    # The one-line summary (its figures: the rate, the GPU-hours so far) is read into the
    # description from gpunet_diagnosis_finding_info when the rule is evaluated, not joined in
    # as a label: a label whose value changes with every run would end the alert and start a
    # new one each minute (a resolved and a firing notification), where an annotation is only
    # brought up to date.
    info = (f"gpunet_diagnosis_finding_info{{{d}, workload=%q, class=%q, culprit=%q, device=%q}}")
    description = ("{{ with printf `" + info + "` $labels.workload $labels.class $labels.culprit $labels.device"
                   " | query }}{{ . | first | label \"summary\" }}{{ else }}{{ $labels.class }} from "
                   "{{ $labels.culprit }}{{ end }} (job {{ $labels.workload }}; culprit {{ $labels.culprit }}"
                   "{{ if $labels.device }} {{ $labels.device }}{{ end }}). The report: " + report[1])
    why_no_for = ("No `for`: the service names a cause only once it has lasted a minute of whole windows,\n"
                  "and withdraws it when its data is older than --max-data-age.")
    return [
        Alert("GpunetDiagnosisFinding", finding(f'class=~"{stalling}"'), "critical",
              "The diagnoser names the cause that stalls a training job.", description, links=(report,),
              comment=f"Classes that stop the job ({', '.join(STALLING_CLASSES)}): a page.\n{why_no_for}"),
        Alert("GpunetDiagnosisFinding", finding(f'class!~"{stalling}"'), "warning",
              "The diagnoser names the cause that slows a training job.", description, links=(report,),
              comment="The same alert for the classes that slow a job without stopping it: a ticket."),
        Alert("GpunetDiagnoserBlind",
              f"max without (workload) (gpunet_diagnosis_data_age_seconds{{{d}}}) > {age}\nor\n"
              f"time() - gpunet_diagnosis_last_success_timestamp_seconds{{{d}}} > {age}\nor\n"
              f"absent(gpunet_diagnosis_last_success_timestamp_seconds{{{d}}})",
              "warning", "The gpunet diagnoser judges no fresh data.",
              "{{ if $labels.instance }}The gpunet diagnoser {{ $labels.instance }} has had no data newer than "
              "{{ $value | humanizeDuration }} to judge, or no run that finished for as long (its limit is "
              f"{s.diagnoser_max_data_age}): its findings are withdrawn and no cause pages.{{{{ else }}}}No gpunet "
              "diagnoser ({{ $labels.job }}) has finished a run: no cause pages.{{ end }}", "1m",
              "Its source (Prometheus, VictoriaMetrics) unreachable or behind, every run failing or timing out,\n"
              "or no diagnoser scraped at all (absent). Symptom alerts still page people directly."),
        Alert("GpunetDiagnoserDown", f"up{{{d}}} == 0", "warning", "The gpunet diagnoser cannot be scraped.",
              "Prometheus has failed to scrape the gpunet diagnoser {{ $labels.instance }} for over 2 minutes: "
              "it diagnoses nothing and answers no alert.", "2m",
              "Warning, not critical: the symptom alerts still page people directly, without their cause."),
    ]


# ---------------------------------------------------------------- the diagnoser's records
# Per node, what `diagnose --prometheus` sums over a node's NICs and GPUs, so that a scheduled
# diagnosis reads a few series a node, not every NIC's and GPU's (diagnoser/sources/recorded.py
# reads them by these names; docs/diagnose.md says how to load them).
DIAGNOSER_GROUP = "gpunet.diagnoser.records"
NIC_INFO_LABELS = "rdma_device, port, driver, link_layer, numa_node, pci_address"
# The NIC counters summed over the node's fabric NICs, with the labels summed away besides device.
DIAGNOSER_NIC_COUNTERS = (
    ("gpunet_nic_transmit_bytes_total", ""), ("gpunet_nic_receive_bytes_total", ""),
    ("gpunet_nic_ecn_marked_packets_total", ""), ("gpunet_nic_cnp_sent_total", ""),
    ("gpunet_nic_cnp_received_total", ""), ("gpunet_nic_rdma_loss_events_total", "kind"),
    ("gpunet_nic_receive_discards_total", ""), ("gpunet_nic_receive_errors_total", ""),
    ("gpunet_nic_carrier_changes_total", ""), ("gpunet_nic_saturated_seconds_total", "direction"),
    ("gpunet_nic_transmit_wait_ticks_total", ""), ("gpunet_nic_pfc_pause_frames_total", "priority"))
DIAGNOSER_GPU_COUNTERS = ("gpunet_gpu_busy_seconds_total", "gpunet_gpu_idle_seconds_total")


def diagnoser_records(s: Settings) -> list[Record | Alert]:
    """A counter is recorded as its growth since the previous evaluation (`:increase`),
    computed per series as diagnose computes a window's (the difference of the last samples;
    after a decrease, a reset, the value since), then summed: a NIC or GPU that appears or
    leaves adds nothing, where a sum of the counters themselves would read a whole counter as
    growth, or as a reset of them all."""
    def m(metric: str, matchers: str = "") -> str:
        inner = ", ".join(x for x in (s.selector, matchers) if x)
        return f"{metric}{{{inner}}}"

    every, back = s.records_interval, s.records_lookback
    nic = f"{s.cluster_label}, job, instance, device"

    def grew(metric: str) -> str:
        # The newest sample only if it is new since the evaluation before, the one before it as
        # far back as the lookback: a series that stopped (a node gone) records nothing, not
        # zeros; an interval without a new sample records nothing and loses nothing (the
        # next one's difference spans it).
        now, before = f"last_over_time({m(metric)}[{every}])", f"last_over_time({m(metric)}[{back}] offset {every})"
        return f"(({now} - {before}) >= 0 or ({now} < {before}))"

    # The training fabric's NICs: the exporter's word where it exports one, else the NICs with
    # an RDMA device, as gpunet.recording's fabric record (inlined: a rule engine backfilling
    # these records cannot read another group's).
    rdma = m("gpunet_nic_info", 'rdma_device!=""')
    fabric = f"({m('gpunet_nic_fabric')} or max without ({NIC_INFO_LABELS}) ({rdma})) == 1"
    on_fabric, off_fabric = f"and on ({nic}) ({fabric})", f"unless on ({nic}) ({fabric})"
    speed = f"avg_over_time({m('gpunet_nic_link_speed_bytes_per_second')}[{every}])"
    tx, rx = grew("gpunet_nic_transmit_bytes_total"), grew("gpunet_nic_receive_bytes_total")

    def name(metric: str, operation: str = "increase") -> str:
        return f"instance:{metric.removesuffix('_total')}:{operation}"

    records: list[Record | Alert] = [
        Record(name(metric), f"sum without (device{', ' + more if more else ''}) (\n  {grew(metric)}\n  {on_fabric}\n)",
               "" if k else f"Growth since the evaluation before ({every} ago), over the node's fabric NICs.")
        for k, (metric, more) in enumerate(DIAGNOSER_NIC_COUNTERS)]
    records += [Record(name(metric), f"sum without (gpu) ({grew(metric)})",
                       "" if k else "Growth since the evaluation before, over the node's GPUs.")
                for k, metric in enumerate(DIAGNOSER_GPU_COUNTERS)]
    records += [
        Record(name("gpunet_gpu_throttled_seconds", "sum_max_increase"),
               f"sum without (gpu) (max without (reason) ({grew('gpunet_gpu_throttled_seconds_total')}))",
               "Each GPU's most active clock-event reason, summed over the node's GPUs."),
        Record(name("gpunet_gpu_busy_seconds", "count"),
               f"count without (gpu) (last_over_time({m('gpunet_gpu_busy_seconds_total')}[{every}]))"),
        Record(name("gpunet_gpu_sm_clock_hertz", "avg"),
               f"avg without (gpu) (avg_over_time({m('gpunet_gpu_sm_clock_hertz')}[{every}]))"),
        Record(name("gpunet_nic_fabric_link_speed_bytes_per_second", "sum"),
               f"sum without (device) ({speed} {on_fabric})"),
        Record(name("gpunet_nic_other_link_speed_bytes_per_second", "sum"),
               f"sum without (device) ({speed} {off_fabric})", "The NICs outside the fabric (management, storage)."),
        Record(name("gpunet_nic_fabric_down", "count"),
               f"sum without (device) ((min_over_time({m('gpunet_nic_up')}[{every}]) == bool 0) {on_fabric})"),
        Record(name("gpunet_nic_fabric", "count"), f"count without (device) ({fabric})"),
        Record(name("gpunet_nic_other_busier_direction_bytes"),
               f"sum without (device) (\n  (({tx} >= {rx}) or {rx})\n  {off_fabric}\n)",
               "Each NIC outside the fabric in its busier direction."),
        Record(name("gpunet_nic_fabric_link_speed_bytes_per_second", "count_values"),
               f'count_values without (device) ("speed", {speed} {on_fabric})',
               "How many of the node's fabric NICs have each speed: the cluster's median link speed."),
    ]
    return records


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _block(key: str, text: str, indent: str) -> list[str]:
    if "\n" not in text:
        return [f"{indent}{key}: {text}"]
    return [f"{indent}{key}: |"] + [f"{indent}  {line}" for line in text.splitlines()]


def render(s: Settings) -> str:
    out = ["# Prometheus alerting and recording rules for gpunet, generated by alerts/build.py: edit",
           "# that file and run it. docs/runbook.md explains each alert, its threshold and what to do.",
           f"# Settings of this build: selector {s.selector}, cluster label {s.cluster_label}, rate interval "
           f"{s.rate_interval},",
           f"# runbook {s.runbook_url_pattern or s.runbook_url_base + '#%s'}"
           + ("," if s.runbook_url_base == Settings.runbook_url_base and not s.runbook_url_pattern else "."),
           *(["# relative to the gpunet source tree: build with --runbook-url-base for links that open."]
             if s.runbook_url_base == Settings.runbook_url_base and not s.runbook_url_pattern else []),
           "# Check: promtool check rules alerts/gpunet.rules.yml; promtool test rules alerts/tests/*.yml",
           "groups:"]
    for group, items in rules(s) + [(DIAGNOSER_GROUP, diagnoser_records(s))]:
        out += [f"  - name: {group}"]
        if group == DIAGNOSER_GROUP:
            out.append(f"    interval: {s.records_interval}")
        out.append("    rules:")
        for item in items:
            if item.comment:
                out += [f"      # {line}" if line else "      #" for line in item.comment.splitlines()]
            if isinstance(item, Record):
                out += [f"      - record: {item.name}"] + _block("expr", item.expr, "        ")
                continue
            out += [f"      - alert: {item.name}"] + _block("expr", item.expr, "        ")
            if item.for_:
                out.append(f"        for: {item.for_}")
            out += ["        labels:", f"          severity: {item.severity}", "        annotations:",
                    f"          summary: {_quote(item.summary)}", f"          description: {_quote(item.description)}",
                    f"          runbook_url: {_quote(s.runbook_url(item.name))}"]
            out += [f"          {name}: {_quote(url)}" for name, url in item.links]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    defaults = Settings()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--selector", default=defaults.selector, help=f"label matchers on every series ({defaults.selector})")
    p.add_argument("--cluster-label", default=defaults.cluster_label,
                   help=f"the label that tells clusters apart ({defaults.cluster_label})")
    p.add_argument("--rate-interval", default=defaults.rate_interval,
                   help=f"window of rates and averages ({defaults.rate_interval}; at least 4 scrape intervals)")
    p.add_argument("--short-rate-interval", default=defaults.short_rate_interval,
                   help=f"window of the rates that must react within minutes, GpunetPfcStorm's "
                        f"({defaults.short_rate_interval}; at least 4 scrape intervals, e.g. 4m at a 60 s scrape)")
    p.add_argument("--runbook-url-base", default=defaults.runbook_url_base,
                   help="absolute URL where you publish docs/runbook.md; each alert links its section, BASE#<alert> "
                        f"(default {defaults.runbook_url_base!r}: the file in the source tree, no address)")
    p.add_argument("--runbook-url-pattern", default=defaults.runbook_url_pattern,
                   help="the mixins' runbookURLPattern instead: a URL with %%s for the alert's name in lower case, "
                        "e.g. https://wiki.example.org/gpunet/%%s")
    p.add_argument("--diagnoser-selector", default=defaults.diagnoser_selector,
                   help=f"label matchers of the diagnoser service's series ({defaults.diagnoser_selector})")
    p.add_argument("--diagnoser-url", default=defaults.diagnoser_url,
                   help="the diagnoser's address as on-call opens it (its --external-url); findings link "
                        f"URL/reports/latest?job=<workload> ({defaults.diagnoser_url})")
    p.add_argument("--diagnoser-max-data-age", default=defaults.diagnoser_max_data_age,
                   help=f"the diagnoser's --max-data-age: older data blinds it ({defaults.diagnoser_max_data_age})")
    p.add_argument("--records-interval", default=defaults.records_interval,
                   help=f"evaluation interval of the {DIAGNOSER_GROUP} records ({defaults.records_interval}; "
                        "your scrape interval gives diagnoses as fine windows as the raw series)")
    p.add_argument("--records-lookback", default=defaults.records_lookback,
                   help=f"how far back those records look for a counter's last sample "
                        f"({defaults.records_lookback}; at least 2 scrape intervals)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--check", action="store_true", help="exit 1 if --out differs from this build")
    args = p.parse_args(argv)
    if args.runbook_url_pattern and "%s" not in args.runbook_url_pattern:
        p.error(f"--runbook-url-pattern {args.runbook_url_pattern!r}: no %s where the alert's name goes")
    text = render(Settings(args.selector, args.cluster_label, args.rate_interval, args.runbook_url_base,
                           args.short_rate_interval, args.runbook_url_pattern, diagnoser_selector=args.diagnoser_selector,
                           diagnoser_url=args.diagnoser_url.rstrip("/"),
                           diagnoser_max_data_age=args.diagnoser_max_data_age,
                           records_interval=args.records_interval, records_lookback=args.records_lookback))
    if args.check:
        if not args.out.exists() or args.out.read_text(encoding="utf-8") != text:
            print(f"stale (run python alerts/build.py): {args.out}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
