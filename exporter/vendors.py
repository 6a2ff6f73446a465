"""Where each driver family keeps the contract's counters.

Drivers name the same thing differently (mlx5 ``tx_prio3_pause``, bnxt
``tx_pfc_ena_frames_pri3``, ice ``tx_priority_3_xoff.nic``). Each table maps a driver's
names to the contract; a tuple of names is tried in order and the first present wins.
Sources and the reasoning for each choice are in docs/vendor-counters.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunet.contract import PFC_PRIORITIES


@dataclass(frozen=True)
class DriverCounters:
    family: str
    netdev_drivers: tuple[str, ...]  # the netdev driver names (uevent DRIVER=)
    rdma_prefixes: tuple[str, ...] = ()  # RDMA device name prefixes (mlx5_, bnxt_re, irdma)
    # ethtool -S names
    wire_rx_bytes: tuple[str, ...] = ()
    wire_tx_bytes: tuple[str, ...] = ()
    pause_frames: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (direction, priority)
    pause_duration: dict[str, tuple[str, str]] = field(default_factory=dict)
    pause_duration_units_per_second: float = 1e6  # the driver counts microseconds
    rx_discards: tuple[str, ...] = ()
    tx_discards: tuple[str, ...] = ()
    rx_errors: tuple[str, ...] = ()
    # sysfs hw_counters names
    ecn_marked: tuple[str, ...] = ()
    cnp_sent: tuple[str, ...] = ()
    cnp_received: tuple[str, ...] = ()
    loss: dict[str, tuple[str, ...]] = field(default_factory=dict)  # contract kind -> names
    out_of_buffer: tuple[str, ...] = ()

    def hw_counter_names(self) -> tuple[str, ...]:
        names = [*self.ecn_marked, *self.cnp_sent, *self.cnp_received, *self.out_of_buffer]
        for alternatives in self.loss.values():
            names.extend(alternatives)
        return tuple(dict.fromkeys(names))


def _per_priority(template: str, direction: str) -> dict[str, tuple[str, str]]:
    return {template.format(p=p): (direction, p) for p in PFC_PRIORITIES if p != "global"}


MLX5 = DriverCounters(
    family="mlx5",
    netdev_drivers=("mlx5_core",),
    rdma_prefixes=("mlx5_",),
    wire_rx_bytes=("rx_bytes_phy",),
    wire_tx_bytes=("tx_bytes_phy",),
    pause_frames={**_per_priority("rx_prio{p}_pause", "receive"), **_per_priority("tx_prio{p}_pause", "transmit"),
                  "rx_global_pause": ("receive", "global"), "tx_global_pause": ("transmit", "global")},
    pause_duration={**_per_priority("rx_prio{p}_pause_duration", "receive"),
                    **_per_priority("tx_prio{p}_pause_duration", "transmit"),
                    "rx_global_pause_duration": ("receive", "global"),
                    "tx_global_pause_duration": ("transmit", "global")},
    rx_discards=("rx_discards_phy",),
    tx_discards=("tx_discards_phy",),
    rx_errors=("rx_crc_errors_phy",),
    ecn_marked=("np_ecn_marked_roce_packets",),
    cnp_sent=("np_cnp_sent",),
    cnp_received=("rp_cnp_handled",),
    loss={"out_of_sequence": ("out_of_sequence",), "sequence_error": ("packet_seq_err",),
          "ack_timeout": ("local_ack_timeout_err",)},
    out_of_buffer=("out_of_buffer",),
)

BNXT = DriverCounters(
    family="bnxt",
    netdev_drivers=("bnxt_en",),
    rdma_prefixes=("bnxt_re",),
    wire_rx_bytes=("rx_bytes",),
    wire_tx_bytes=("tx_bytes",),
    pause_frames={**_per_priority("rx_pfc_ena_frames_pri{p}", "receive"),
                  **_per_priority("tx_pfc_ena_frames_pri{p}", "transmit"),
                  "rx_pause_frames": ("receive", "global"), "tx_pause_frames": ("transmit", "global")},
    pause_duration={**_per_priority("rx_pfc_ena_duration_us_pri{p}", "receive"),
                    **_per_priority("tx_pfc_ena_duration_us_pri{p}", "transmit")},
    rx_discards=("rx_discard_packets", "rx_total_discard_pkts"),
    tx_discards=("tx_discard_packets", "tx_total_discard_pkts"),
    rx_errors=("rx_fcs_err_frames",),
    ecn_marked=("rx_ecn_marked_pkts",),
    cnp_sent=("tx_cnp_pkts",),
    cnp_received=("rx_cnp_pkts",),
    loss={"out_of_sequence": ("res_oos_drop_count",), "sequence_error": ("seq_err_naks_rcvd",),
          "ack_timeout": ("to_retransmits",)},
)

ICE = DriverCounters(
    family="ice",
    netdev_drivers=("ice",),
    rdma_prefixes=("irdma", "rocep"),
    wire_rx_bytes=("rx_bytes.nic", "port.rx_bytes"),
    wire_tx_bytes=("tx_bytes.nic", "port.tx_bytes"),
    # E810 counts XOFF (pause) and XON (resume) separately; a pause frame is an XOFF.
    pause_frames={**_per_priority("rx_priority_{p}_xoff.nic", "receive"),
                  **_per_priority("tx_priority_{p}_xoff.nic", "transmit"),
                  **_per_priority("port.rx_priority_{p}_xoff", "receive"),
                  **_per_priority("port.tx_priority_{p}_xoff", "transmit"),
                  "link_xoff_rx.nic": ("receive", "global"), "link_xoff_tx.nic": ("transmit", "global"),
                  "port.link_xoff_rx": ("receive", "global"), "port.link_xoff_tx": ("transmit", "global")},
    rx_discards=("rx_dropped_link_down.nic", "rx_oversize.nic"),
    rx_errors=("rx_crc_errors.nic", "port.rx_crc_errors"),
    ecn_marked=("RxECNMrkd",),
    cnp_sent=("cnpSent",),
    cnp_received=("cnpHandled",),
    loss={"out_of_sequence": ("RxOOS",) },
)

FAMILIES = (MLX5, BNXT, ICE)
GENERIC = DriverCounters(family="generic", netdev_drivers=())


def counters_for(driver: str, rdma_device: str = "") -> DriverCounters:
    """The table of a netdev driver (or, for a port without netdev, of its RDMA device)."""
    for fam in FAMILIES:
        if driver in fam.netdev_drivers:
            return fam
    for fam in FAMILIES:
        if rdma_device and rdma_device.startswith(fam.rdma_prefixes):
            return fam
    return GENERIC
