"""The names, units and labels of every series gpunet exports or reads.

This module is the code form of the metric contract (docs/metrics.md): the exporter, the diagnoser, the
simulator, the dashboards' tests and the unit tests all import a metric's name from here,
so that it is written exactly once. Metrics marked ``contract=True`` are the public
contract; the others are extras users expect beside them (they may evolve, but are
documented in docs/metrics.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

MetricType = Literal["counter", "gauge"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    contract: bool = False

    def __post_init__(self) -> None:
        # Conventions of docs/metrics.md, checked when the module is imported.
        assert self.name.startswith("gpunet_"), self.name
        assert (self.type == "counter") == self.name.endswith("_total"), self.name


# Units a family name may end with (longest first): OpenMetrics states it in a # UNIT line,
# which must be a suffix of the family's name (the exposition and the trace writer add it).
UNITS = ("bytes_per_second", "transfers_per_second", "seconds", "bytes", "ratio", "celsius", "watts", "hertz",
         "joules")


@lru_cache(maxsize=4096)  # asked for every family of every OpenMetrics render
def unit_of(family: str) -> str | None:
    """The unit a family's name ends with (without _total), None for a count of things."""
    return next((unit for unit in UNITS if family.endswith("_" + unit)), None)


def _m(name: str, type_: MetricType, help_: str, labels: tuple[str, ...] = (), contract: bool = False) -> MetricSpec:
    return MetricSpec(name, type_, help_, labels, contract)


DEV = ("device",)

# --- NIC (docs/metrics.md) -------------------------------------------------------------
NIC_INFO = _m("gpunet_nic_info", "gauge", "One per NIC port; empty string where unknown.",
              ("device", "rdma_device", "port", "driver", "link_layer", "numa_node", "pci_address"), True)
NIC_LINK_SPEED = _m("gpunet_nic_link_speed_bytes_per_second", "gauge", "Negotiated link speed.", DEV, True)
NIC_UP = _m("gpunet_nic_up", "gauge", "1 when operstate is up and carrier present, else 0.", DEV, True)
NIC_CARRIER_CHANGES = _m("gpunet_nic_carrier_changes_total", "counter", "Link flaps (carrier changes).", DEV, True)
NIC_RECEIVE_BYTES = _m("gpunet_nic_receive_bytes_total", "counter",
                       "Bytes received on the wire, RDMA included.", DEV, True)
NIC_TRANSMIT_BYTES = _m("gpunet_nic_transmit_bytes_total", "counter",
                        "Bytes sent on the wire, RDMA included.", DEV, True)
NIC_PFC_PAUSE_FRAMES = _m("gpunet_nic_pfc_pause_frames_total", "counter",
                          "PFC pause frames per priority (global: 802.3x pause) and direction.",
                          ("device", "direction", "priority"), True)
NIC_ECN_MARKED = _m("gpunet_nic_ecn_marked_packets_total", "counter",
                    "RoCE packets received with an ECN CE mark (notification point).", DEV, True)
NIC_CNP_SENT = _m("gpunet_nic_cnp_sent_total", "counter",
                  "Congestion notification packets sent (notification point).", DEV, True)
NIC_CNP_RECEIVED = _m("gpunet_nic_cnp_received_total", "counter",
                      "CNPs handled by the rate limiter (reaction point).", DEV, True)
NIC_RDMA_LOSS_EVENTS = _m("gpunet_nic_rdma_loss_events_total", "counter",
                          "RDMA go-back-N triggers: out-of-sequence packets received, NAK-sequence errors, "
                          "local ACK timeouts.", ("device", "kind"), True)
NIC_RECEIVE_DISCARDS = _m("gpunet_nic_receive_discards_total", "counter",
                          "Packets the NIC dropped for lack of buffer or by policy.", DEV, True)
NIC_SATURATED_SECONDS = _m("gpunet_nic_saturated_seconds_total", "counter",
                           "Time, at the exporter's fast tick, during which the direction ran at >= 90% of "
                           "link speed.", ("device", "direction"), True)

# --- NIC extras ----------------------------------------------------------------------------
NODE_NETWORK_STATE_SECONDS = _m("gpunet_node_network_state_seconds_total", "counter",
                                 "Time the node's training-fabric NICs spent in each network_state (paused, "
                                 "saturated, active or quiet: the first that holds), at the fast tick.",
                                 ("network_state",))
NODE_NETWORK_BURSTS = _m("gpunet_node_network_bursts_total", "counter",
                          "Times the node's training fabric went from quiet to busier (>= 5% of link speed, or "
                          "paused) at the fast tick: communication phases (all-reduce bursts) that a quiet tick "
                          "separates. bytes / bursts is the traffic of one burst.")
NIC_PFC_PAUSE_DURATION = _m("gpunet_nic_pfc_pause_duration_seconds_total", "counter",
                            "Time the port was paused (receive) or asked its peer to pause (transmit), where "
                            "the driver counts it.", ("device", "direction", "priority"))
NIC_TRANSMIT_DISCARDS = _m("gpunet_nic_transmit_discards_total", "counter",
                           "Packets the NIC dropped on transmit.", DEV)
NIC_RECEIVE_ERRORS = _m("gpunet_nic_receive_errors_total", "counter",
                        "Frames received with errors on the wire (CRC, symbol, malformed).", DEV)
NIC_LINK_DOWNED = _m("gpunet_nic_link_downed_total", "counter",
                     "Times the link went down (InfiniBand link_downed; the driver's link-down events on Ethernet).",
                     DEV)
# PHY health: how a degrading cable, optic or connector shows itself before the link flaps.
NIC_SYMBOL_ERRORS = _m("gpunet_nic_symbol_errors_total", "counter",
                       "Physical-layer symbol errors (the PCS on Ethernet, symbol_error on InfiniBand).", DEV)
NIC_FEC_CORRECTED_BIT_ERRORS = _m("gpunet_nic_fec_corrected_bit_errors_total", "counter",
                            "Bits the forward error correction repaired: the link's errors before FEC, its margin.",
                            DEV)
NIC_FEC_CORRECTED_BLOCKS = _m("gpunet_nic_fec_corrected_blocks_total", "counter",
                              "FEC codewords received with errors and corrected.", DEV)
NIC_FEC_UNCORRECTABLE_BLOCKS = _m("gpunet_nic_fec_uncorrectable_blocks_total", "counter",
                                  "FEC codewords received with more errors than FEC corrects: frames lost.", DEV)
# InfiniBand's congestion signal: with credit-based flow control there are no pause frames.
NIC_TRANSMIT_WAIT = _m("gpunet_nic_transmit_wait_ticks_total", "counter",
                       "InfiniBand port_xmit_wait: sampling ticks in which the port had data to send but no credit "
                       "from its peer (the credit-based analogue of receiving PFC pauses; the tick is the HCA's).",
                       DEV)
NIC_RDMA_OUT_OF_BUFFER = _m("gpunet_nic_rdma_out_of_buffer_total", "counter",
                            "RDMA packets dropped because no receive WQE was posted.", DEV)
NIC_FABRIC = _m("gpunet_nic_fabric", "gauge",
                 "1 when the NIC belongs to the training fabric whose traffic decides network_state "
                 "(RDMA NICs by default, or --fabric-devices), else 0.", DEV)
NIC_MTU = _m("gpunet_nic_mtu_bytes", "gauge", "MTU of the netdev.", DEV)
NIC_NETDEV_RECEIVE_BYTES = _m("gpunet_nic_netdev_receive_bytes_total", "counter",
                              "Bytes the kernel's network stack received (RDMA not included).", DEV)
NIC_NETDEV_TRANSMIT_BYTES = _m("gpunet_nic_netdev_transmit_bytes_total", "counter",
                               "Bytes the kernel's network stack sent (RDMA not included).", DEV)
NIC_NETDEV_RECEIVE_PACKETS = _m("gpunet_nic_netdev_receive_packets_total", "counter",
                                "Packets the kernel's network stack received.", DEV)
NIC_NETDEV_TRANSMIT_PACKETS = _m("gpunet_nic_netdev_transmit_packets_total", "counter",
                                 "Packets the kernel's network stack sent.", DEV)
NIC_NETDEV_RECEIVE_ERRORS = _m("gpunet_nic_netdev_receive_errors_total", "counter", "Netdev rx_errors.", DEV)
NIC_NETDEV_TRANSMIT_ERRORS = _m("gpunet_nic_netdev_transmit_errors_total", "counter", "Netdev tx_errors.", DEV)
NIC_NETDEV_RECEIVE_DROPS = _m("gpunet_nic_netdev_receive_drops_total", "counter", "Netdev rx_dropped.", DEV)
NIC_NETDEV_TRANSMIT_DROPS = _m("gpunet_nic_netdev_transmit_drops_total", "counter", "Netdev tx_dropped.", DEV)

# --- Configuration facts: what the deployment checks read ------------------------
NIC_PFC_ENABLED = _m("gpunet_nic_pfc_enabled", "gauge",
                     "1 when PFC is enabled on the priority (DCB/IEEE 802.1Qbb), else 0.", ("device", "priority"))
NIC_LINK_PAUSE_ENABLED = _m("gpunet_nic_link_pause_enabled", "gauge",
                            "1 when global 802.3x pause is enabled in the direction (ethtool -a), else 0.",
                            ("device", "direction"))
NIC_ECN_ENABLED = _m("gpunet_nic_ecn_enabled", "gauge",
                     "1 when RoCE congestion control (ECN/DCQCN) is enabled on the priority at the notification "
                     "point (marks answered with CNPs) or reaction point (CNPs slow the sender), else 0.",
                     ("device", "priority", "point"))
NIC_QOS_TRUST_INFO = _m("gpunet_nic_qos_trust_info", "gauge",
                        "What the NIC trusts to classify received packets into priorities: pcp or dscp.",
                        ("device", "trust"))
NIC_PCIE_CURRENT_SPEED = _m("gpunet_nic_pcie_current_link_transfers_per_second", "gauge",
                            "PCIe link speed the NIC's function trained at, per lane (8e9 = 8 GT/s, Gen3).", DEV)
NIC_PCIE_MAX_SPEED = _m("gpunet_nic_pcie_max_link_transfers_per_second", "gauge",
                        "The most PCIe link speed the NIC's link can train at, per lane: the lower of what the "
                        "function and the port above it support.", DEV)
NIC_PCIE_CURRENT_WIDTH = _m("gpunet_nic_pcie_current_link_width", "gauge", "PCIe lanes the NIC trained at.", DEV)
NIC_PCIE_MAX_WIDTH = _m("gpunet_nic_pcie_max_link_width", "gauge",
                        "The most PCIe lanes the NIC's link can train at: the lower of what the function and the "
                        "port above it support.", DEV)
BOND_INFO = _m("gpunet_bond_info", "gauge", "One per bonding device: its mode and transmit hash policy.",
               ("bond", "mode", "xmit_hash_policy"))
BOND_MEMBER_UP = _m("gpunet_bond_member_up", "gauge",
                    "One per member of a bond: 1 when its MII status is up, else 0.", ("bond", "device"))

# --- TCP (docs/metrics.md, plus extras) -------------------------------------------------
TCP_RETRANSMITTED = _m("gpunet_tcp_retransmitted_segments_total", "counter", "TCP RetransSegs of the node.",
                       (), True)
TCP_SENT = _m("gpunet_tcp_sent_segments_total", "counter", "TCP OutSegs of the node.", (), True)
TCP_RECEIVED = _m("gpunet_tcp_received_segments_total", "counter", "TCP InSegs of the node.")
TCP_TIMEOUTS = _m("gpunet_tcp_timeouts_total", "counter", "TCP retransmission timeouts (TcpExt TCPTimeouts).")

# --- GPU (docs/metrics.md) --------------------------------------------------------------
GPU_INFO = _m("gpunet_gpu_info", "gauge", "One per GPU.", ("gpu", "uuid", "model", "pci_address", "numa_node"), True)
GPU_UTILIZATION = _m("gpunet_gpu_utilization_ratio", "gauge",
                     "Latest NVML utilization (time a kernel ran / sample period).", ("gpu",), True)
GPU_BUSY_SECONDS = _m("gpunet_gpu_busy_seconds_total", "counter",
                      "Integral over time of NVML utilization: seconds in which a kernel ran.", ("gpu",), True)
GPU_IDLE_SECONDS = _m("gpunet_gpu_idle_seconds_total", "counter",
                      "Complement of busy seconds, split by what the node's network did in the same fast tick.",
                      ("gpu", "network_state"), True)
GPU_THROTTLED_SECONDS = _m("gpunet_gpu_throttled_seconds_total", "counter",
                           "Time an NVML clock-event reason that slows the GPU was active.", ("gpu", "reason"), True)
GPU_SM_CLOCK = _m("gpunet_gpu_sm_clock_hertz", "gauge", "SM clock.", ("gpu",), True)

# --- GPU extras ------------------------------------------------------------------------------
GPU = ("gpu",)
GPU_UP = _m("gpunet_gpu_up", "gauge", "1 while NVML answers for the GPU; 0 when it is lost or its calls hang.", GPU)
GPU_DRIVER_INFO = _m("gpunet_gpu_driver_info", "gauge", "NVIDIA driver version of the node.", ("driver_version",))
GPU_POWER = _m("gpunet_gpu_power_watts", "gauge", "Power draw.", GPU)
GPU_TEMPERATURE = _m("gpunet_gpu_temperature_celsius", "gauge", "GPU core temperature.", GPU)
GPU_MEMORY_USED = _m("gpunet_gpu_memory_used_bytes", "gauge", "Framebuffer memory in use.", GPU)
GPU_MEMORY_TOTAL = _m("gpunet_gpu_memory_total_bytes", "gauge", "Framebuffer memory size.", GPU)
GPU_PCIE_TRANSMIT = _m("gpunet_gpu_pcie_transmit_bytes_per_second", "gauge",
                       "PCIe throughput from the GPU (NVML's 20 ms sample).", GPU)
GPU_PCIE_RECEIVE = _m("gpunet_gpu_pcie_receive_bytes_per_second", "gauge",
                      "PCIe throughput to the GPU (NVML's 20 ms sample).", GPU)
GPU_XID_ERRORS = _m("gpunet_gpu_xid_errors_total", "counter",
                    "XID critical errors reported by the driver, per XID code.", ("gpu", "xid"))
# GPU health, dcgm-exporter's staples: what tells a sick GPU from a slow network.
GPU_ECC_ERRORS = _m("gpunet_gpu_ecc_errors_total", "counter",
                    "Memory ECC errors since the driver loaded (NVML volatile counters), by type: corrected or "
                    "uncorrected.", ("gpu", "type"))
GPU_REMAPPED_ROWS = _m("gpunet_gpu_remapped_rows", "gauge",
                       "Memory rows remapped to spares (Ampere and newer), by the errors that caused it: correctable "
                       "or uncorrectable.", ("gpu", "cause"))
GPU_ROW_REMAP_PENDING = _m("gpunet_gpu_row_remap_pending", "gauge",
                           "1 when a row remapping waits for a GPU reset to take effect.", GPU)
GPU_ROW_REMAP_FAILED = _m("gpunet_gpu_row_remap_failed", "gauge",
                          "1 when a row remapping failed (no spare row left): the GPU needs replacing.", GPU)
GPU_NVLINK_ERRORS = _m("gpunet_gpu_nvlink_errors_total", "counter",
                       "NVLink errors summed over the GPU's links seen up since the exporter started (a link "
                       "going down keeps its errors in the sum), by kind: replay, recovery, crc_flit, crc_data, "
                       "ecc_data.", ("gpu", "kind"))
GPU_SM_ACTIVE = _m("gpunet_gpu_sm_active_ratio", "gauge",
                   "Fraction of SMs busy between the last two slow reads (NVML GPM, Hopper and newer).", GPU)
GPU_SM_OCCUPANCY = _m("gpunet_gpu_sm_occupancy_ratio", "gauge",
                      "Resident warps / theoretical maximum between the last two slow reads (NVML GPM).", GPU)
GPU_TENSOR_ACTIVE = _m("gpunet_gpu_tensor_active_ratio", "gauge",
                       "Fraction of time any tensor pipe was active between the last two slow reads (NVML GPM).", GPU)

GPU_PCIE_CURRENT_SPEED = _m("gpunet_gpu_pcie_current_link_transfers_per_second", "gauge",
                            "PCIe link speed the GPU trained at, per lane (GPUs lower it when idle).", GPU)
GPU_PCIE_MAX_SPEED = _m("gpunet_gpu_pcie_max_link_transfers_per_second", "gauge",
                        "The most PCIe link speed the GPU's link can train at, per lane: the lower of what the "
                        "GPU and the port above it support.", GPU)
GPU_PCIE_CURRENT_WIDTH = _m("gpunet_gpu_pcie_current_link_width", "gauge", "PCIe lanes the GPU trained at.", GPU)
GPU_PCIE_MAX_WIDTH = _m("gpunet_gpu_pcie_max_link_width", "gauge",
                        "The most PCIe lanes the GPU's link can train at: the lower of what the GPU and the port "
                        "above it support.", GPU)
# Which workload uses each GPU. An info metric joinable on `gpu`, so that the
# workload's labels are not repeated on every series (`job` is Prometheus' own label).
GPU_WORKLOAD_INFO = _m("gpunet_gpu_workload_info", "gauge",
                       "One per (GPU, workload using it): source is kubernetes, slurm, torchelastic (torchrun's run id) "
                       "or process (the command name only).",
                       ("gpu", "workload", "source", "namespace", "pod", "container"))

# --- Exporter self-metrics -----------------------------------------------------------------
EXPORTER_BUILD_INFO = _m("gpunet_exporter_build_info", "gauge", "Version of the running exporter.",
                         ("version", "root"))
COLLECTOR_UP = _m("gpunet_exporter_collector_up", "gauge",
                  "1 when the collector's last run read every source without error.", ("collector",))
COLLECTOR_DURATION = _m("gpunet_exporter_collector_duration_seconds", "gauge",
                        "How long the collector's last run took.", ("collector",))
COLLECTOR_ERRORS = _m("gpunet_exporter_collector_errors_total", "counter",
                      "Source errors the collector met (unreadable or malformed value, device gone).",
                      ("collector",))
COLLECTOR_LAST_SUCCESS = _m("gpunet_exporter_collector_last_run_timestamp_seconds", "gauge",
                            "Unix time of the collector's last run.", ("collector",))
TICKS = _m("gpunet_exporter_ticks_total", "counter", "Sampler ticks begun.", ("tick",))
TICKS_LATE = _m("gpunet_exporter_ticks_late_total", "counter",
                "Ticks that started more than one interval late (the previous tick overran).", ("tick",))
TICK_INTERVAL = _m("gpunet_exporter_tick_interval_seconds", "gauge", "Configured tick interval.", ("tick",))
HTTP_BAD_REQUESTS = _m("gpunet_exporter_http_bad_requests_total", "counter",
                       "Requests refused as malformed HTTP (answered 400, logged at debug only).")
HTTP_REFUSED = _m("gpunet_exporter_http_refused_total", "counter",
                  "Connections and requests turned away or cut, by reason: connection_limit (past "
                  "--web.max-connections), header_timeout, write_timeout, request_limit (503, past --web.max-requests), "
                  "auth_busy (503, too many password checks at once), rate_limit (429, the web config's rate_limit), "
                  "client_cert (403, a certificate outside client_allowed_sans).", ("reason",))
HTTP_OPEN_CONNECTIONS = _m("gpunet_exporter_http_open_connections", "gauge", "HTTP connections open.")

# --- Enumerations the contract fixes -------------------------------------------------------
DIRECTIONS = ("receive", "transmit")
PFC_PRIORITIES = tuple(str(p) for p in range(8)) + ("global",)
RDMA_LOSS_KINDS = ("out_of_sequence", "sequence_error", "ack_timeout")
NETWORK_STATES = ("paused", "saturated", "active", "quiet")  # first match wins, in this order
ECN_POINTS = ("notification", "reaction")
WORKLOAD_SOURCES = ("kubernetes", "slurm", "torchelastic", "process")
HTTP_REFUSED_REASONS = ("connection_limit", "header_timeout", "write_timeout", "request_limit", "auth_busy",
                        "rate_limit", "client_cert")


def workload_names_a_job(source: str, namespace: str) -> bool:
    """Whether a gpunet_gpu_workload_info row names a job, the same on all its nodes: not the
    exporter's last resorts, a command name (source process: every job runs python3) or a
    pod UID found in a cgroup (source kubernetes without a namespace: one per node)."""
    return not (source == "process" or (source == "kubernetes" and not namespace))
ECC_ERROR_TYPES = ("corrected", "uncorrected")
NVLINK_ERROR_KINDS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")  # NVML's counter order
THROTTLE_REASONS = ("sw_power_cap", "sw_thermal", "hw_slowdown", "hw_thermal", "hw_power_brake")
SATURATED_RATIO = 0.90  # a direction at >= 90% of link speed is saturated
ACTIVE_RATIO = 0.05  # ... and at >= 5% active
BOTTLENECK_CLASSES = ("network_bandwidth", "network_congestion", "pfc_storm", "packet_loss",
                      "link_degraded", "gpu_throttle", "straggler", "host_bound")

DEFAULT_PORT = 9845

ALL_METRICS: tuple[MetricSpec, ...] = tuple(v for v in list(globals().values()) if isinstance(v, MetricSpec))
BY_NAME: dict[str, MetricSpec] = {m.name: m for m in ALL_METRICS}


def metrics_markdown() -> str:
    """docs/metrics.md, generated: `python -m gpunet.contract > docs/metrics.md`."""
    lines = ["# Metrics", "",
             "Generated from `gpunet/contract.py` (`python -m gpunet.contract > docs/metrics.md`).",
             "Contract metrics are gpunet's public surface; extras may evolve.", "",
             "| name | type | labels | contract | meaning |", "|---|---|---|---|---|"]
    for m in ALL_METRICS:
        lines.append(f"| `{m.name}` | {m.type} | {', '.join(m.labels) or '-'} | {'yes' if m.contract else ''} "
                     f"| {m.help} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(metrics_markdown(), end="")
