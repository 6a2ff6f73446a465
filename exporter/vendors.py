"""Where each driver family keeps the contract's counters.

Drivers name the same thing differently (mlx5 ``tx_prio3_pause``, bnxt
``tx_pfc_ena_frames_pri3``, ice ``tx_priority_3_xoff.nic``). Each table maps a driver's
names to the contract; a tuple of names is tried in order and the first present wins.
Sources and the reasoning for each choice are in docs/vendor-counters.md.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property

from gpunet.contract import PFC_PRIORITIES

Names = tuple  # alternatives tried in order; an alternative that is itself a tuple is a sum


@dataclass(frozen=True)
class DriverCounters:
    family: str
    netdev_drivers: tuple[str, ...]  # the PCI driver of the NIC (uevent DRIVER=)
    rdma_prefixes: tuple[str, ...] = ()  # RDMA device name prefixes, for ports without netdev
    # ethtool -S names
    wire_rx_bytes: Names = ()
    wire_tx_bytes: Names = ()
    pause_frames: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (direction, priority)
    pause_duration: dict[str, tuple[str, str]] = field(default_factory=dict)
    pause_duration_units_per_second: float = 1e6  # drivers count microseconds
    rx_discards: Names = ()
    tx_discards: Names = ()
    rx_errors: Names = ()
    # PHY health
    symbol_errors: Names = ()
    fec_corrected_bit_errors: Names = ()
    fec_corrected_blocks: Names = ()
    fec_uncorrectable_blocks: Names = ()
    link_down_events: Names = ()
    # sysfs hw_counters names
    ecn_marked: Names = ()
    cnp_sent: Names = ()
    cnp_received: Names = ()
    loss: dict[str, Names] = field(default_factory=dict)  # contract kind -> names
    out_of_buffer: Names = ()
    hw_counter_wrap: float | None = None  # width of the driver's hw_counters, where they wrap

    @cached_property  # asked on every read, for every NIC
    def wire_names(self) -> frozenset[str]:
        """What the fast tick reads from the driver: wire bytes and pause frames."""
        return flat_names(self.wire_rx_bytes, self.wire_tx_bytes, self.pause_frames)

    @cached_property
    def pause_frame_aliases(self) -> tuple[tuple[tuple[str, str], tuple[str, ...]], ...]:
        """((direction, priority), its names in the order tried), from pause_frames."""
        return by_labels(self.pause_frames)

    @cached_property
    def pause_duration_aliases(self) -> tuple[tuple[tuple[str, str], tuple[str, ...]], ...]:
        """((direction, priority), its names in the order tried), from pause_duration."""
        return by_labels(self.pause_duration)

    @cached_property
    def received_pause_aliases(self) -> tuple[tuple[tuple[str, str], tuple[str, ...]], ...]:
        """The entries of pause_frame_aliases for received frames (every priority, and global)."""
        return tuple(entry for entry in self.pause_frame_aliases if entry[0][0] == "receive")

    @cached_property
    def slow_names(self) -> frozenset[str]:
        return flat_names(self.pause_duration, self.rx_discards, self.tx_discards, self.rx_errors,
                          self.symbol_errors, self.fec_corrected_bit_errors, self.fec_corrected_blocks,
                          self.fec_uncorrectable_blocks, self.link_down_events)

    @cached_property  # asked for every RDMA port, every slow tick
    def hw_counter_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for alternatives in (self.ecn_marked, self.cnp_sent, self.cnp_received, self.out_of_buffer,
                             *self.loss.values()):
            for alt in alternatives:
                names.extend(alt if isinstance(alt, tuple) else (alt,))
        return tuple(dict.fromkeys(names))


def by_labels(names: dict[str, tuple[str, str]]) -> tuple[tuple[tuple[str, str], tuple[str, ...]], ...]:
    """A name -> (direction, priority) table as ((direction, priority), its names in order)."""
    aliases: dict[tuple[str, str], list[str]] = {}
    for name, labels in names.items():
        aliases.setdefault(labels, []).append(name)
    return tuple((labels, tuple(names)) for labels, names in aliases.items())


def flat_names(*groups) -> frozenset[str]:
    """Every counter name in alternatives tuples and name->label dicts."""
    names: set[str] = set()
    for group in groups:
        for alt in group:
            names.update(alt if isinstance(alt, tuple) else (alt,))
    return frozenset(names)


def first_present(values: Collection[str], alternatives: Names) -> tuple[str, ...] | None:
    """The names of the first alternative present in `values`: the name, or those present
    of a tuple alternative (which are summed); None where none is."""
    for alt in alternatives:
        if isinstance(alt, tuple):
            present = tuple(n for n in alt if n in values)
            if present:
                return present
        elif alt in values:
            return (alt,)
    return None


def pick(values: dict[str, float], alternatives: Names) -> float | None:
    """The value of the first alternative present (first_present); a tuple alternative sums
    its names present (a sum is NaN, unknown, where a part's value is: exporter/readers/ethtool.py)."""
    names = first_present(values, alternatives)
    if names is None:
        return None
    return values[names[0]] if len(names) == 1 else sum(values[n] for n in names)


def _per_priority(template: str, direction: str) -> dict[str, tuple[str, str]]:
    return {template.format(p=p): (direction, p) for p in PFC_PRIORITIES if p != "global"}


MLX5 = DriverCounters(
    family="mlx5",
    netdev_drivers=("mlx5_core",),
    rdma_prefixes=("mlx5_",),
    wire_rx_bytes=("rx_bytes_phy",),
    wire_tx_bytes=("tx_bytes_phy",),
    # Per-priority counters are printed only for priorities with PFC on; global pause
    # counters only with 802.3x pause on, else the IEEE 802.3 MAC-control counters.
    pause_frames={**_per_priority("rx_prio{p}_pause", "receive"), **_per_priority("tx_prio{p}_pause", "transmit"),
                  "rx_global_pause": ("receive", "global"), "tx_global_pause": ("transmit", "global"),
                  "rx_pause_ctrl_phy": ("receive", "global"), "tx_pause_ctrl_phy": ("transmit", "global")},
    pause_duration={**_per_priority("rx_prio{p}_pause_duration", "receive"),
                    **_per_priority("tx_prio{p}_pause_duration", "transmit"),
                    "rx_global_pause_duration": ("receive", "global"),
                    "tx_global_pause_duration": ("transmit", "global")},
    # The port's own buffer drops. rx_out_of_buffer (host RQ empty) and the RDMA
    # out_of_buffer are host-side and exported apart (gpunet_nic_rdma_out_of_buffer_total).
    rx_discards=("rx_discards_phy",),
    tx_discards=("tx_discards_phy",),
    rx_errors=("rx_crc_errors_phy",),
    # The phy group; its FEC block counts are not in ethtool -S (netlink FEC statistics).
    symbol_errors=("rx_pcs_symbol_err_phy", "rx_symbol_err_phy"),
    fec_corrected_bit_errors=("rx_corrected_bits_phy",),
    link_down_events=("link_down_events_phy",),
    ecn_marked=("np_ecn_marked_roce_packets",),
    cnp_sent=("np_cnp_sent",),
    cnp_received=("rp_cnp_handled",),
    loss={"out_of_sequence": ("out_of_sequence",), "sequence_error": ("packet_seq_err",),
          "ack_timeout": ("local_ack_timeout_err",)},
    out_of_buffer=("out_of_buffer",),
    hw_counter_wrap=float(2**32),  # Q counters are 32-bit and wrap
)

BNXT = DriverCounters(
    family="bnxt",
    netdev_drivers=("bnxt_en",),
    rdma_prefixes=("bnxt_re",),
    wire_rx_bytes=("rx_bytes",),  # port statistics; per-ring ones are "[N]: rx_ucast_bytes"
    wire_tx_bytes=("tx_bytes",),
    pause_frames={**_per_priority("rx_pfc_ena_frames_pri{p}", "receive"),
                  **_per_priority("tx_pfc_ena_frames_pri{p}", "transmit"),
                  "rx_pause_frames": ("receive", "global"), "tx_pause_frames": ("transmit", "global")},
    pause_duration={**_per_priority("pfc_pri{p}_rx_duration_us", "receive"),
                    **_per_priority("pfc_pri{p}_tx_duration_us", "transmit")},
    rx_discards=(tuple(f"rx_discard_packets_cos{c}" for c in range(8)),),
    tx_discards=(tuple(f"tx_discard_packets_cos{c}" for c in range(8)),),
    rx_errors=("rx_fcs_err_frames",),
    symbol_errors=("rx_pcs_symbol_err",),
    fec_corrected_bit_errors=("rx_corrected_bits",),
    fec_corrected_blocks=("rx_fec_corrected_blocks",),
    fec_uncorrectable_blocks=("rx_fec_uncorrectable_blocks",),
    link_down_events=("link_down_events",),
    ecn_marked=("rx_ecn_marked_pkts",),
    cnp_sent=("tx_cnp_pkts",),
    cnp_received=("rx_cnp_pkts",),
    loss={"out_of_sequence": ("oos_drop_count", "res_oos_drop_count"), "sequence_error": ("seq_err_naks_rcvd",),
          "ack_timeout": ("to_retransmits",)},
    out_of_buffer=("rx_out_of_buffer",),
)

ICE = DriverCounters(
    family="ice",
    netdev_drivers=("ice",),
    rdma_prefixes=("irdma",),
    wire_rx_bytes=("rx_bytes.nic", "port.rx_bytes"),  # kernels before 6.2 print "port." names
    wire_tx_bytes=("tx_bytes.nic", "port.tx_bytes"),
    # E810 counts XOFF (pause) and XON (resume) separately; a pause frame is an XOFF.
    pause_frames={**_per_priority("rx_priority_{p}_xoff.nic", "receive"),
                  **_per_priority("tx_priority_{p}_xoff.nic", "transmit"),
                  **_per_priority("port.rx_priority_{p}_xoff", "receive"),
                  **_per_priority("port.tx_priority_{p}_xoff", "transmit"),
                  "link_xoff_rx.nic": ("receive", "global"), "link_xoff_tx.nic": ("transmit", "global"),
                  "port.link_xoff_rx": ("receive", "global"), "port.link_xoff_tx": ("transmit", "global")},
    rx_discards=("rx_dropped.nic", "port.rx_dropped"),
    rx_errors=("rx_crc_errors.nic", "port.rx_crc_errors"),
    ecn_marked=("RxECNMrkd",),
    cnp_sent=("cnpSent",),
    cnp_received=("cnpHandled",),
    # E810 (irdma gen 2) has no go-back-N counters; gen 3 hardware names them so.
    loss={"out_of_sequence": ("Rcvd Out of order packets",), "sequence_error": ("Nak Sequence Error",),
          "ack_timeout": ("RTO",)},
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
