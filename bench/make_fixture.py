#!/usr/bin/env python3
"""Write a fixture tree (tests/fixtures/nodes/README.md) of a GPU node with 8 mlx5 RoCE ports.

    python bench/make_fixture.py OUT_DIR [--ports 8] [--channels 32] [--template DIR]

The tree is a *static* snapshot: nothing advances while an exporter reads it, so every
rate it shows is zero and the exporter's parse caches stay warm (tests/fixtures/nodes/README.md).

Without --template the tree is generated from scratch: per port
``sys/class/net/<dev>/`` (statistics/, speed, operstate, carrier, ..., and ``device/`` as a
real folder with uevent, numa_node and the PCIe link attributes),
``sys/class/infiniband/mlx5_N/ports/1/`` (link_layer, rate, state, gid_attrs/ndevs/0,
counters/, hw_counters/), ``ethtool/<dev>.txt`` in the form ``ethtool -S`` prints with
the full mlx5 counter set (software, vport, phy, per-priority, and per-channel counters
for --channels channels), plus ``proc/net/snmp``, ``proc/net/netstat`` and ``nvml.json``
(8 H100s; the exporter then runs its GPU collectors too; --no-gpus leaves it out).

With --template DIR (a fixture node such as tests/fixtures/nodes/roce-mlx5) its first
mlx5 RoCE port is replicated into --ports ports, renamed, with their own PCI addresses
and NUMA nodes; proc/ is copied as is.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path

NET = "sys/class/net"
IB = "sys/class/infiniband"

# An 8-GPU server: four NICs per socket, one per PCIe switch, like the GPUs.
PCI_ADDRESSES = ("0000:0c:00.0", "0000:2a:00.0", "0000:41:00.0", "0000:58:00.0",
                 "0000:86:00.0", "0000:a5:00.0", "0000:bd:00.0", "0000:d5:00.0")
GPU_BUS_IDS = ("0000:18:00.0", "0000:2b:00.0", "0000:3f:00.0", "0000:5d:00.0",
               "0000:9a:00.0", "0000:ab:00.0", "0000:c0:00.0", "0000:dc:00.0")

NETDEV_STATS = ("collisions", "multicast", "rx_bytes", "rx_compressed", "rx_crc_errors", "rx_dropped",
                "rx_errors", "rx_fifo_errors", "rx_frame_errors", "rx_length_errors", "rx_missed_errors",
                "rx_nohandler", "rx_over_errors", "rx_packets", "tx_aborted_errors", "tx_bytes",
                "tx_carrier_errors", "tx_compressed", "tx_dropped", "tx_errors", "tx_fifo_errors",
                "tx_heartbeat_errors", "tx_packets", "tx_window_errors")

# InfiniBand PortCounters as a ConnectX port shows them on RoCE too.
IB_COUNTERS = ("VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
               "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
               "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
               "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
               "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets",
               "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets")

# mlx5 hw_counters of a RoCE port (kernel 6.x, ConnectX-7).
HW_COUNTERS = ("duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err",
               "np_cnp_sent", "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence",
               "packet_seq_err", "req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors",
               "req_remote_invalid_request", "req_rnr_retries_exceeded", "req_transport_retries_exceeded",
               "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
               "resp_remote_access_errors", "rnr_nak_retry_err", "roce_adp_retrans", "roce_adp_retrans_to",
               "roce_slow_restart", "roce_slow_restart_cnps", "roce_slow_restart_trans", "rp_cnp_handled",
               "rp_cnp_ignored", "rx_atomic_requests", "rx_dct_connect", "rx_icrc_encapsulated",
               "rx_read_requests", "rx_write_requests")

# ethtool -S, in the order mlx5 prints them.
SW_STATS = ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "tx_tso_packets", "tx_tso_bytes",
            "tx_tso_inner_packets", "tx_tso_inner_bytes", "tx_added_vlan_packets", "tx_nop", "tx_mpwqe_blks",
            "tx_mpwqe_pkts", "rx_lro_packets", "rx_lro_bytes", "rx_gro_packets", "rx_gro_bytes", "rx_gro_skbs",
            "rx_gro_match_packets", "rx_gro_large_hds", "rx_ecn_mark", "rx_removed_vlan_packets",
            "rx_csum_unnecessary", "rx_csum_none", "rx_csum_complete", "rx_csum_complete_tail",
            "rx_csum_complete_tail_slow", "rx_csum_unnecessary_inner", "rx_xdp_drop", "rx_xdp_redirect",
            "rx_xdp_tx_xmit", "rx_xdp_tx_mpwqe", "rx_xdp_tx_inlnw", "rx_xdp_tx_nops", "rx_xdp_tx_full",
            "rx_xdp_tx_err", "rx_xdp_tx_cqe", "tx_csum_none", "tx_csum_partial", "tx_csum_partial_inner",
            "tx_queue_stopped", "tx_queue_dropped", "tx_xmit_more", "tx_recover", "tx_cqes", "tx_queue_wake",
            "tx_cqe_err", "tx_xdp_xmit", "tx_xdp_mpwqe", "tx_xdp_inlnw", "tx_xdp_nops", "tx_xdp_full",
            "tx_xdp_err", "tx_xdp_cqes", "rx_wqe_err", "rx_mpwqe_filler_cqes", "rx_mpwqe_filler_strides",
            "rx_oversize_pkts_sw_drop", "rx_buff_alloc_err", "rx_cqe_compress_blks", "rx_cqe_compress_pkts",
            "rx_congst_umr", "rx_arfs_err", "rx_recover", "rx_pp_alloc_fast", "rx_pp_alloc_slow",
            "rx_pp_alloc_slow_high_order", "rx_pp_alloc_empty", "rx_pp_alloc_refill", "rx_pp_alloc_waive",
            "rx_pp_recycle_cached", "rx_pp_recycle_cache_full", "rx_pp_recycle_ring",
            "rx_pp_recycle_ring_full", "rx_pp_recycle_released_ref", "ch_events", "ch_poll", "ch_arm",
            "ch_aff_change", "ch_force_irq", "ch_eq_rearm", "rx_xsk_packets", "rx_xsk_bytes",
            "rx_xsk_csum_complete", "rx_xsk_csum_unnecessary", "rx_xsk_csum_unnecessary_inner",
            "rx_xsk_csum_none", "rx_xsk_ecn_mark", "rx_xsk_removed_vlan_packets", "rx_xsk_xdp_drop",
            "rx_xsk_xdp_redirect", "rx_xsk_wqe_err", "rx_xsk_mpwqe_filler_cqes", "rx_xsk_mpwqe_filler_strides",
            "rx_xsk_oversize_pkts_sw_drop", "rx_xsk_buff_alloc_err", "rx_xsk_cqe_compress_blks",
            "rx_xsk_cqe_compress_pkts", "rx_xsk_congst_umr", "tx_xsk_xmit", "tx_xsk_mpwqe", "tx_xsk_inlnw",
            "tx_xsk_full", "tx_xsk_err", "tx_xsk_cqes",
            "rx_out_of_buffer", "rx_if_down_packets",
            "rx_steer_missed_packets",
            "rx_vport_unicast_packets", "rx_vport_unicast_bytes", "tx_vport_unicast_packets",
            "tx_vport_unicast_bytes", "rx_vport_multicast_packets", "rx_vport_multicast_bytes",
            "tx_vport_multicast_packets", "tx_vport_multicast_bytes", "rx_vport_broadcast_packets",
            "rx_vport_broadcast_bytes", "tx_vport_broadcast_packets", "tx_vport_broadcast_bytes",
            "rx_vport_rdma_unicast_packets", "rx_vport_rdma_unicast_bytes", "tx_vport_rdma_unicast_packets",
            "tx_vport_rdma_unicast_bytes", "rx_vport_rdma_multicast_packets", "rx_vport_rdma_multicast_bytes",
            "tx_vport_rdma_multicast_packets", "tx_vport_rdma_multicast_bytes")
PHY_STATS = ("tx_packets_phy", "rx_packets_phy", "rx_crc_errors_phy", "tx_bytes_phy", "rx_bytes_phy",
             "tx_multicast_phy", "tx_broadcast_phy", "rx_multicast_phy", "rx_broadcast_phy",
             "rx_in_range_len_errors_phy", "rx_out_of_range_len_phy", "rx_oversize_pkts_phy",
             "rx_symbol_err_phy", "tx_mac_control_phy", "rx_mac_control_phy", "rx_unsupported_op_phy",
             "rx_pause_ctrl_phy", "tx_pause_ctrl_phy", "rx_discards_phy", "tx_discards_phy", "tx_errors_phy",
             "rx_undersize_pkts_phy", "rx_fragments_phy", "rx_jabbers_phy", "rx_64_bytes_phy",
             "rx_65_to_127_bytes_phy", "rx_128_to_255_bytes_phy", "rx_256_to_511_bytes_phy",
             "rx_512_to_1023_bytes_phy", "rx_1024_to_1518_bytes_phy", "rx_1519_to_2047_bytes_phy",
             "rx_2048_to_4095_bytes_phy", "rx_4096_to_8191_bytes_phy", "rx_8192_to_10239_bytes_phy",
             "link_down_events_phy", "rx_pcs_symbol_err_phy", "rx_corrected_bits_phy", "rx_err_lane_0_phy",
             "rx_err_lane_1_phy", "rx_err_lane_2_phy", "rx_err_lane_3_phy", "rx_buffer_passed_thres_phy",
             "rx_pci_signal_integrity", "tx_pci_signal_integrity", "outbound_pci_stalled_rd",
             "outbound_pci_stalled_wr", "outbound_pci_stalled_rd_events", "outbound_pci_stalled_wr_events")
PRIO_TRAFFIC = ("rx_prio{p}_bytes", "rx_prio{p}_packets", "rx_prio{p}_discards", "tx_prio{p}_bytes",
                "tx_prio{p}_packets")
PRIO_PAUSE = ("rx_prio{p}_pause", "rx_prio{p}_pause_duration", "tx_prio{p}_pause", "tx_prio{p}_pause_duration",
              "rx_prio{p}_pause_transition")
PRIO_BUFFER = ("rx_prio{p}_buf_discard", "rx_prio{p}_cong_discard", "rx_prio{p}_marked")
GLOBAL_TAIL = ("rx_global_pause", "rx_global_pause_duration", "tx_global_pause", "tx_global_pause_duration",
               "rx_global_pause_transition", "tx_pause_storm_warning_events", "tx_pause_storm_error_events",
               "module_unplug", "module_bus_stuck", "module_high_temp", "module_bad_shorted")
CH_STATS = ("events", "poll", "arm", "aff_change", "force_irq", "eq_rearm")
RXQ_STATS = ("packets", "bytes", "csum_complete", "csum_complete_tail", "csum_complete_tail_slow",
             "csum_unnecessary", "csum_unnecessary_inner", "csum_none", "xdp_drop", "xdp_redirect",
             "lro_packets", "lro_bytes", "gro_packets", "gro_bytes", "gro_skbs", "gro_match_packets",
             "gro_large_hds", "ecn_mark", "removed_vlan_packets", "wqe_err", "mpwqe_filler_cqes",
             "mpwqe_filler_strides", "oversize_pkts_sw_drop", "buff_alloc_err", "cqe_compress_blks",
             "cqe_compress_pkts", "congst_umr", "arfs_err", "recover", "pp_alloc_fast", "pp_alloc_slow",
             "pp_alloc_empty", "pp_recycle_cached", "pp_recycle_ring")
RXQ_XDP_STATS = ("xmit", "mpwqe", "inlnw", "nops", "full", "err", "cqes")
TXQ_STATS = ("packets", "bytes", "tso_packets", "tso_bytes", "tso_inner_packets", "tso_inner_bytes",
             "csum_partial", "csum_partial_inner", "added_vlan_packets", "nop", "mpwqe_blks", "mpwqe_pkts",
             "csum_none", "stopped", "dropped", "xmit_more", "recover", "cqes", "wake", "cqe_err")

# /proc/net/snmp and /proc/net/netstat in the layout of a Linux 6.x kernel.
SNMP = """\
Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 1 64 {ip_in} 0 3 0 0 0 {ip_in} {ip_out} 12 4 0 0 0 0 0 0 0 {ip_out}
Icmp: InMsgs InErrors InCsumErrors InDestUnreachs InTimeExcds InParmProbs InSrcQuenchs InRedirects InEchos InEchoReps InTimestamps InTimestampReps InAddrMasks InAddrMaskReps OutMsgs OutErrors OutRateLimitGlobal OutRateLimitHost OutDestUnreachs OutTimeExcds OutParmProbs OutSrcQuenchs OutRedirects OutEchos OutEchoReps OutTimestamps OutTimestampReps OutAddrMasks OutAddrMaskReps
Icmp: 4211 0 0 3102 0 0 0 0 1109 0 0 0 0 0 4320 0 0 0 3211 0 0 0 0 0 1109 0 0 0 0
IcmpMsg: InType3 InType8 OutType0 OutType3
IcmpMsg: 3102 1109 1109 3211
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 {active} {passive} 311 902 {estab} {in_segs} {out_segs} {retrans} 0 {out_rsts} 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 8812331 3211 0 8813004 0 0 0 1203 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 0 0 0 0 0
"""
TCPEXT_FIELDS = ["SyncookiesSent", "SyncookiesRecv", "SyncookiesFailed", "EmbryonicRsts", "PruneCalled", "RcvPruned", "OfoPruned", "OutOfWindowIcmps", "LockDroppedIcmps", "ArpFilter", "TW", "TWRecycled", "TWKilled", "PAWSActive", "PAWSEstab", "BeyondWindow", "TSEcrRejected", "PAWSOldAck", "PAWSTimewait", "DelayedACKs", "DelayedACKLocked", "DelayedACKLost", "ListenOverflows", "ListenDrops", "TCPHPHits", "TCPPureAcks", "TCPHPAcks", "TCPRenoRecovery", "TCPSackRecovery", "TCPSACKReneging", "TCPSACKReorder", "TCPRenoReorder", "TCPTSReorder", "TCPFullUndo", "TCPPartialUndo", "TCPDSACKUndo", "TCPLossUndo", "TCPLostRetransmit", "TCPRenoFailures", "TCPSackFailures", "TCPLossFailures", "TCPFastRetrans", "TCPSlowStartRetrans", "TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery", "TCPRenoRecoveryFail", "TCPSackRecoveryFail", "TCPRcvCollapsed", "TCPBacklogCoalesce", "TCPDSACKOldSent", "TCPDSACKOfoSent", "TCPDSACKRecv", "TCPDSACKOfoRecv", "TCPAbortOnData", "TCPAbortOnClose", "TCPAbortOnMemory", "TCPAbortOnTimeout", "TCPAbortOnLinger", "TCPAbortFailed", "TCPMemoryPressures", "TCPMemoryPressuresChrono", "TCPSACKDiscard", "TCPDSACKIgnoredOld", "TCPDSACKIgnoredNoUndo", "TCPSpuriousRTOs", "TCPMD5NotFound", "TCPMD5Unexpected", "TCPMD5Failure", "TCPSackShifted", "TCPSackMerged", "TCPSackShiftFallback", "TCPBacklogDrop", "PFMemallocDrop", "TCPMinTTLDrop", "TCPDeferAcceptDrop", "IPReversePathFilter", "TCPTimeWaitOverflow", "TCPReqQFullDoCookies", "TCPReqQFullDrop", "TCPRetransFail", "TCPRcvCoalesce", "TCPOFOQueue", "TCPOFODrop", "TCPOFOMerge", "TCPChallengeACK", "TCPSYNChallenge", "TCPFastOpenActive", "TCPFastOpenActiveFail", "TCPFastOpenPassive", "TCPFastOpenPassiveFail", "TCPFastOpenListenOverflow", "TCPFastOpenCookieReqd", "TCPFastOpenBlackhole", "TCPSpuriousRtxHostQueues", "BusyPollRxPackets", "TCPAutoCorking", "TCPFromZeroWindowAdv", "TCPToZeroWindowAdv", "TCPWantZeroWindowAdv", "TCPSynRetrans", "TCPOrigDataSent", "TCPHystartTrainDetect", "TCPHystartTrainCwnd", "TCPHystartDelayDetect", "TCPHystartDelayCwnd", "TCPACKSkippedSynRecv", "TCPACKSkippedPAWS", "TCPACKSkippedSeq", "TCPACKSkippedFinWait2", "TCPACKSkippedTimeWait", "TCPACKSkippedChallenge", "TCPWinProbe", "TCPKeepAlive", "TCPMTUPFail", "TCPMTUPSuccess", "TCPDelivered", "TCPDeliveredCE", "TCPAckCompressed", "TCPZeroWindowDrop", "TCPRcvQDrop", "TCPWqueueTooBig", "TCPFastOpenPassiveAltKey", "TcpTimeoutRehash", "TcpDuplicateDataRehash", "TCPDSACKRecvSegs", "TCPDSACKIgnoredDubious", "TCPMigrateReqSuccess", "TCPMigrateReqFailure", "TCPPLBRehash", "TCPAORequired", "TCPAOBad", "TCPAOKeyNotFound", "TCPAOGood", "TCPAODroppedIcmps"]
IPEXT_FIELDS = ["InNoRoutes", "InTruncatedPkts", "InMcastPkts", "OutMcastPkts", "InBcastPkts", "OutBcastPkts", "InOctets", "OutOctets", "InMcastOctets", "OutMcastOctets", "InBcastOctets", "OutBcastOctets", "InCsumErrors", "InNoECTPkts", "InECT1Pkts", "InECT0Pkts", "InCEPkts", "ReasmOverlaps"]


class Writer:
    def __init__(self, out: Path):
        self.out = out
        self.files = 0

    def write(self, rel: str, content: str) -> None:
        dest = self.out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(content)
        self.files += 1


def _port_values(rng: random.Random, index: int, channels: int) -> dict[str, int]:
    """One consistent set of counters of a port that has carried a few days of training."""
    rx_bytes = rng.randrange(6 * 10**14, 9 * 10**14)  # ~ days at a fraction of 200 Gb/s
    tx_bytes = rx_bytes + rng.randrange(-10**13, 10**13)
    mtu_payload = 4096 + 58
    rx_pkts, tx_pkts = rx_bytes // mtu_payload, tx_bytes // mtu_payload
    kernel_rx, kernel_tx = rng.randrange(10**9, 5 * 10**9), rng.randrange(10**9, 5 * 10**9)  # TCP/NCCL bootstrap
    v: dict[str, int] = {}
    r = lambda lo, hi: rng.randrange(lo, hi)  # noqa: E731
    # Software (kernel path) counters: a small share of the wire; RoCE bypasses them.
    v.update(dict.fromkeys(SW_STATS, 0))
    v.update(rx_packets=kernel_rx // 1500, rx_bytes=kernel_rx, tx_packets=kernel_tx // 1500, tx_bytes=kernel_tx,
             tx_tso_packets=r(10**5, 10**6), tx_tso_bytes=kernel_tx // 3, tx_added_vlan_packets=0,
             tx_nop=r(100, 5000), rx_gro_packets=r(10**5, 10**6), rx_gro_bytes=kernel_rx // 2,
             rx_gro_skbs=r(10**4, 10**5), rx_csum_unnecessary=kernel_rx // 1600, rx_csum_complete=r(10**5, 10**6),
             rx_csum_none=r(10, 1000), tx_csum_partial=kernel_tx // 1700, tx_csum_none=r(10**4, 10**5),
             tx_xmit_more=r(10**4, 10**6), tx_cqes=kernel_tx // 1600, tx_queue_wake=r(0, 30),
             tx_queue_stopped=r(0, 30), rx_mpwqe_filler_cqes=r(0, 100), rx_cqe_compress_blks=r(10**4, 10**5),
             rx_cqe_compress_pkts=r(10**5, 10**6), rx_pp_alloc_fast=r(10**6, 10**7), rx_pp_recycle_ring=r(10**6, 10**7),
             ch_events=r(10**7, 10**8), ch_poll=r(10**7, 10**8), ch_arm=r(10**7, 10**8), ch_aff_change=r(0, 50),
             ch_eq_rearm=0, rx_out_of_buffer=r(0, 2000), rx_steer_missed_packets=r(0, 1000),
             rx_vport_unicast_packets=kernel_rx // 1500, rx_vport_unicast_bytes=kernel_rx,
             tx_vport_unicast_packets=kernel_tx // 1500, tx_vport_unicast_bytes=kernel_tx,
             rx_vport_multicast_packets=r(10**3, 10**5), rx_vport_multicast_bytes=r(10**5, 10**7),
             tx_vport_multicast_packets=r(10, 1000), tx_vport_multicast_bytes=r(10**3, 10**5),
             rx_vport_broadcast_packets=r(10**3, 10**5), rx_vport_broadcast_bytes=r(10**5, 10**7),
             tx_vport_broadcast_packets=r(10, 1000), tx_vport_broadcast_bytes=r(10**3, 10**5),
             rx_vport_rdma_unicast_packets=rx_pkts, rx_vport_rdma_unicast_bytes=rx_bytes - kernel_rx,
             tx_vport_rdma_unicast_packets=tx_pkts, tx_vport_rdma_unicast_bytes=tx_bytes - kernel_tx)
    # Physical port: everything that crossed the wire, RoCE included.
    v.update(dict.fromkeys(PHY_STATS, 0))
    v.update(tx_packets_phy=tx_pkts + kernel_tx // 1500, rx_packets_phy=rx_pkts + kernel_rx // 1500,
             tx_bytes_phy=tx_bytes, rx_bytes_phy=rx_bytes, rx_crc_errors_phy=r(0, 3),
             tx_multicast_phy=r(10, 1000), tx_broadcast_phy=r(10, 1000), rx_multicast_phy=r(10**3, 10**5),
             rx_broadcast_phy=r(10**3, 10**5), rx_discards_phy=r(0, 500), rx_64_bytes_phy=r(10**6, 10**8),
             rx_65_to_127_bytes_phy=r(10**7, 10**9), rx_128_to_255_bytes_phy=r(10**6, 10**8),
             rx_256_to_511_bytes_phy=r(10**6, 10**8), rx_512_to_1023_bytes_phy=r(10**6, 10**8),
             rx_1024_to_1518_bytes_phy=r(10**6, 10**8), rx_1519_to_2047_bytes_phy=r(10**5, 10**7),
             rx_2048_to_4095_bytes_phy=r(10**5, 10**7), rx_4096_to_8191_bytes_phy=rx_pkts,
             link_down_events_phy=r(1, 4), rx_corrected_bits_phy=r(10**3, 10**6),
             rx_pause_ctrl_phy=0, tx_pause_ctrl_phy=0, rx_mac_control_phy=0, tx_mac_control_phy=0)
    # Per priority: RoCE on 3 (PFC on), CNPs on 6, the rest on 0.
    for p in range(8):
        share = {3: 0.97, 0: 0.03}.get(p, 0.0)
        pause = {3: (r(10**4, 10**6), r(10**6, 10**8))}.get(p, (0, 0))
        v.update({f"rx_prio{p}_bytes": int(rx_bytes * share), f"rx_prio{p}_packets": int(rx_pkts * share),
                  f"rx_prio{p}_discards": 0, f"tx_prio{p}_bytes": int(tx_bytes * share),
                  f"tx_prio{p}_packets": int(tx_pkts * share),
                  f"rx_prio{p}_pause": pause[0], f"rx_prio{p}_pause_duration": pause[1],
                  f"tx_prio{p}_pause": pause[0] // 7, f"tx_prio{p}_pause_duration": pause[1] // 7,
                  f"rx_prio{p}_pause_transition": pause[0] // 2,
                  f"rx_prio{p}_buf_discard": 0, f"rx_prio{p}_cong_discard": 0,
                  f"rx_prio{p}_marked": r(10**5, 10**7) if p == 3 else 0})
    v.update(dict.fromkeys(GLOBAL_TAIL, 0))
    v["module_unplug"] = r(0, 2)
    # Per channel: the kernel traffic spread over the channels.
    for c in range(channels):
        crx, ctx = kernel_rx // channels, kernel_tx // channels
        v.update({f"ch{c}_{k}": 0 for k in CH_STATS})
        v.update({f"ch{c}_events": r(10**5, 10**6), f"ch{c}_poll": r(10**5, 10**6), f"ch{c}_arm": r(10**5, 10**6),
                  f"ch{c}_aff_change": r(0, 3)})
        v.update({f"rx{c}_{k}": 0 for k in RXQ_STATS})
        v.update({f"rx{c}_packets": crx // 1500, f"rx{c}_bytes": crx, f"rx{c}_csum_unnecessary": crx // 1600,
                  f"rx{c}_csum_complete": r(10**3, 10**5), f"rx{c}_gro_packets": r(10**3, 10**5),
                  f"rx{c}_gro_bytes": crx // 2, f"rx{c}_gro_skbs": r(10**2, 10**4),
                  f"rx{c}_cqe_compress_blks": r(10**2, 10**4), f"rx{c}_cqe_compress_pkts": r(10**3, 10**5),
                  f"rx{c}_pp_alloc_fast": r(10**4, 10**6), f"rx{c}_pp_recycle_ring": r(10**4, 10**6)})
        v.update({f"rx{c}_xdp_tx_{k}": 0 for k in RXQ_XDP_STATS})
        v.update({f"tx{c}_{k}": 0 for k in TXQ_STATS})
        v.update({f"tx{c}_packets": ctx // 1500, f"tx{c}_bytes": ctx, f"tx{c}_tso_packets": r(10**3, 10**5),
                  f"tx{c}_tso_bytes": ctx // 3, f"tx{c}_csum_partial": ctx // 1700, f"tx{c}_xmit_more": r(10**3, 10**5),
                  f"tx{c}_cqes": ctx // 1600, f"tx{c}_nop": r(0, 200), f"tx{c}_wake": r(0, 2),
                  f"tx{c}_stopped": r(0, 2)})
    # RDMA port counters (IB PortCounters count data in 4-octet words).
    v["ib:port_rcv_data"], v["ib:port_xmit_data"] = rx_bytes // 4, tx_bytes // 4
    v["ib:port_rcv_packets"], v["ib:port_xmit_packets"] = rx_pkts, tx_pkts
    v["ib:unicast_rcv_packets"], v["ib:unicast_xmit_packets"] = rx_pkts, tx_pkts
    v["ib:port_xmit_wait"] = r(10**6, 10**9)
    v["ib:link_downed"] = v["link_down_events_phy"]
    v["hw:np_ecn_marked_roce_packets"] = v["rx_prio3_marked"]
    v["hw:np_cnp_sent"] = v["rx_prio3_marked"] // 3
    v["hw:rp_cnp_handled"] = r(10**5, 10**7)
    v["hw:rp_cnp_ignored"] = r(0, 100)
    v["hw:out_of_buffer"] = v["rx_out_of_buffer"]
    v["hw:out_of_sequence"] = r(0, 50)
    v["hw:packet_seq_err"] = r(0, 20)
    v["hw:local_ack_timeout_err"] = r(0, 10)
    v["hw:implied_nak_seq_err"] = r(0, 20)
    v["hw:duplicate_request"] = r(0, 20)
    v["hw:req_cqe_flush_error"] = r(0, 200)
    v["hw:resp_cqe_flush_error"] = r(0, 200)
    v["hw:rx_write_requests"] = r(10**8, 10**10)
    v["hw:rx_read_requests"] = r(10**5, 10**7)
    v["hw:rx_atomic_requests"] = r(0, 10**4)
    v["hw:roce_adp_retrans"] = r(0, 20)
    v["hw:roce_slow_restart"] = r(0, 5)
    v["hw:roce_slow_restart_cnps"] = r(0, 50)
    v["hw:roce_slow_restart_trans"] = r(0, 5)
    v["netdev:rx_bytes"], v["netdev:tx_bytes"] = kernel_rx, kernel_tx
    v["netdev:rx_packets"], v["netdev:tx_packets"] = kernel_rx // 1500, kernel_tx // 1500
    v["netdev:multicast"] = v["rx_vport_multicast_packets"]
    v["netdev:rx_dropped"] = r(0, 100)
    return v


def ethtool_text(v: dict[str, int], channels: int) -> str:
    names = list(SW_STATS) + list(PHY_STATS)
    for p in range(8):
        names += [t.format(p=p) for t in PRIO_TRAFFIC]
    for p in range(8):
        names += [t.format(p=p) for t in PRIO_PAUSE]
    for p in range(8):
        names += [t.format(p=p) for t in PRIO_BUFFER]
    names += GLOBAL_TAIL
    for c in range(channels):
        names += [f"ch{c}_{k}" for k in CH_STATS]
    for c in range(channels):
        names += [f"rx{c}_{k}" for k in RXQ_STATS] + [f"rx{c}_xdp_tx_{k}" for k in RXQ_XDP_STATS]
    for c in range(channels):
        names += [f"tx{c}_{k}" for k in TXQ_STATS]
    return "NIC statistics:\n" + "".join(f"     {n}: {v.get(n, 0)}\n" for n in names)


def write_port(w: Writer, i: int, netdev: str, rdma: str, pci: str, numa: int, v: dict[str, int],
               channels: int) -> None:
    net = f"{NET}/{netdev}"
    for stat in NETDEV_STATS:
        w.write(f"{net}/statistics/{stat}", f"{v.get('netdev:' + stat, 0)}\n")
    attrs = {"speed": "200000", "operstate": "up", "carrier": "1", "carrier_changes": str(2 * v["link_down_events_phy"] + 2),
             "mtu": "4200", "type": "1", "dev_port": "0", "address": f"b8:3f:d2:4c:{0x10 + i:02x}:a0",
             "addr_len": "6", "duplex": "full", "ifindex": str(4 + i), "tx_queue_len": "1000"}
    for name, value in attrs.items():
        w.write(f"{net}/{name}", value + "\n")
    # device/ is a real folder here, not the sysfs link: the PCI function's attributes.
    dev = f"{net}/device"
    w.write(f"{dev}/uevent", f"DRIVER=mlx5_core\nPCI_CLASS=20000\nPCI_ID=15B3:1021\nPCI_SUBSYS_ID=15B3:0041\n"
                             f"PCI_SLOT_NAME={pci}\nMODALIAS=pci:v000015B3d00001021sv000015B3sd00000041bc02sc00i00\n")
    pci_attrs = {"numa_node": str(numa), "vendor": "0x15b3", "device": "0x1021",
                 "current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe",
                 "current_link_width": "16", "max_link_width": "16", "local_cpulist": "0-47,96-143" if numa == 0
                 else "48-95,144-191"}
    for name, value in pci_attrs.items():
        w.write(f"{dev}/{name}", value + "\n")
    # RDMA device and its one RoCE port.
    ib = f"{IB}/{rdma}"
    for name, value in {"node_type": "1: CA", "fw_ver": "28.39.1002", "hca_type": "MT4129",
                        "board_id": "MT_0000000838", "node_guid": f"b83f:d203:004c:{0x10 + i:02x}a0"}.items():
        w.write(f"{ib}/{name}", value + "\n")
    w.write(f"{ib}/device/uevent", f"DRIVER=mlx5_core\nPCI_SLOT_NAME={pci}\n")
    w.write(f"{ib}/device/numa_node", f"{numa}\n")
    w.write(f"{ib}/device/net/{netdev}/.keep", "")
    port = f"{ib}/ports/1"
    for name, value in {"link_layer": "Ethernet", "rate": "200 Gb/sec (4X HDR)", "state": "4: ACTIVE",
                        "phys_state": "5: LinkUp", "lid": "0x0", "sm_lid": "0x0", "lid_mask_count": "0",
                        "cap_mask": "0x00010000"}.items():
        w.write(f"{port}/{name}", value + "\n")
    w.write(f"{port}/gid_attrs/ndevs/0", netdev + "\n")
    w.write(f"{port}/gid_attrs/ndevs/1", netdev + "\n")
    w.write(f"{port}/gid_attrs/types/0", "IB/RoCE v1\n")
    w.write(f"{port}/gid_attrs/types/1", "RoCE v2\n")
    for name in IB_COUNTERS:
        w.write(f"{port}/counters/{name}", f"{v.get('ib:' + name, 0)}\n")
    for name in HW_COUNTERS:
        w.write(f"{port}/hw_counters/{name}", f"{v.get('hw:' + name, 0)}\n")
    w.write(f"ethtool/{netdev}.txt", ethtool_text(v, channels))
    # Configuration facts: PFC on 3, trust dscp, no 802.3x pause, ECN on 3.
    w.write(f"dcb/{netdev}.pfc.json", json.dumps({"pfc_cap": 8, "macsec_bypass": False, "delay": 0,
                                                  "prio_pfc": [p == 3 for p in range(8)]}) + "\n")
    w.write(f"dcb/{netdev}.app.json", json.dumps({"dscp_prio": [[26, 3], [48, 6]]}) + "\n")
    w.write(f"ethtool/{netdev}.pause.txt", f"Pause parameters for {netdev}:\nAutonegotiate:\toff\nRX:\t\toff\n"
                                           "TX:\t\toff\n\n")
    for point in ("roce_np", "roce_rp"):
        for prio in range(8):
            w.write(f"{net}/ecn/{point}/enable/{prio}", f"{int(prio == 3)}\n")


def write_proc(w: Writer, rng: random.Random) -> None:
    in_segs = rng.randrange(10**9, 5 * 10**9)
    w.write("proc/net/snmp", SNMP.format(ip_in=in_segs + 9 * 10**6, ip_out=in_segs + 7 * 10**6,
                                         active=rng.randrange(10**5, 10**6), passive=rng.randrange(10**5, 10**6),
                                         estab=rng.randrange(50, 400), in_segs=in_segs,
                                         out_segs=in_segs - rng.randrange(10**6, 10**7),
                                         retrans=rng.randrange(10**4, 10**5), out_rsts=rng.randrange(10**3, 10**4)))
    tcpext = dict.fromkeys(TCPEXT_FIELDS, 0)
    tcpext.update(TW=rng.randrange(10**5, 10**6), DelayedACKs=rng.randrange(10**6, 10**7),
                  TCPHPHits=rng.randrange(10**8, 10**9), TCPPureAcks=rng.randrange(10**7, 10**8),
                  TCPHPAcks=rng.randrange(10**7, 10**8), TCPSackRecovery=rng.randrange(10**3, 10**4),
                  TCPFastRetrans=rng.randrange(10**4, 10**5), TCPTimeouts=rng.randrange(10**3, 10**4),
                  TCPLossProbes=rng.randrange(10**4, 10**5), TCPRcvCoalesce=rng.randrange(10**6, 10**7),
                  TCPOrigDataSent=rng.randrange(10**9, 2 * 10**9), TCPDelivered=rng.randrange(10**9, 2 * 10**9),
                  TCPKeepAlive=rng.randrange(10**4, 10**5), TCPAutoCorking=rng.randrange(10**5, 10**6))
    ipext = dict.fromkeys(IPEXT_FIELDS, 0)
    ipext.update(InOctets=rng.randrange(10**12, 10**13), OutOctets=rng.randrange(10**12, 10**13),
                 InNoECTPkts=in_segs, InMcastPkts=rng.randrange(10**3, 10**4))
    lines = []
    for proto, table in (("TcpExt", tcpext), ("IpExt", ipext)):
        lines.append(f"{proto}: " + " ".join(table))
        lines.append(f"{proto}: " + " ".join(str(x) for x in table.values()))
    w.write("proc/net/netstat", "\n".join(lines) + "\n")


def write_nvml(w: Writer, ports: int) -> None:
    gpus = [{"index": g, "uuid": f"GPU-5f3c{g:04x}-8a1e-4b2c-9d7e-0c1a2b3c{g:04x}", "name": "NVIDIA H100 80GB HBM3",
             "pci_bus_id": GPU_BUS_IDS[g % len(GPU_BUS_IDS)], "numa_node": 0 if g < ports // 2 else 1,
             "utilization_gpu": 0, "sm_clock_hz": 1980000000, "clock_event_reasons": []} for g in range(ports)]
    # H100s keep a utilization sample buffer, sampled every 1/6 s: the exporter reads it once a second.
    w.write("nvml.json", json.dumps({"driver_version": "550.90.07", "sample_period_seconds": 1 / 6, "gpus": gpus},
                                    indent=2) + "\n")
    for gpu in gpus:  # their PCI functions, for the PCIe link facts
        bus = gpu["pci_bus_id"].lower()
        dev = f"sys/bus/pci/devices/{bus.split(':', 1)[0][-4:]}:{bus.split(':', 1)[1]}"
        for name, value in (("current_link_speed", "32.0 GT/s PCIe"), ("max_link_speed", "32.0 GT/s PCIe"),
                            ("current_link_width", "16"), ("max_link_width", "16")):
            w.write(f"{dev}/{name}", value + "\n")


def port_names(i: int) -> tuple[str, str, str, int]:
    """(netdev, rdma device, PCI address, NUMA node) of port i."""
    pci = PCI_ADDRESSES[i] if i < len(PCI_ADDRESSES) else f"0000:{0xe0 + i:02x}:00.0"
    return f"ens{i + 1}f0np0", f"mlx5_{i}", pci, 0 if i < 4 else 1


def generate(out: Path, ports: int = 8, channels: int = 32, seed: int = 20240611, gpus: bool = True) -> int:
    rng = random.Random(seed)
    w = Writer(out)
    for i in range(ports):
        netdev, rdma, pci, numa = port_names(i)
        write_port(w, i, netdev, rdma, pci, numa if ports == 8 else (0 if i < ports // 2 else 1),
                   _port_values(rng, i, channels), channels)
    write_proc(w, rng)
    if gpus:
        write_nvml(w, ports)  # one GPU per NIC; the exporter reads GPUs from it under a fixture root
    return w.files


# --- from a template node -------------------------------------------------------------------
def _template_ports(template: Path) -> list[tuple[str, str]]:
    """(netdev, rdma device) of each RoCE port of a fixture node (gid_attrs/ndevs/0 names the
    netdev, link_layer is Ethernet)."""
    found = []
    ib = template / IB
    for rdma in sorted(os.listdir(ib)) if ib.is_dir() else []:
        for port in sorted(os.listdir(ib / rdma / "ports")):
            pdir = ib / rdma / "ports" / port
            ndev, ll = pdir / "gid_attrs" / "ndevs" / "0", pdir / "link_layer"
            if ndev.is_file() and ll.is_file() and ll.read_text().strip() == "Ethernet":
                found.append((ndev.read_text().strip(), rdma))
    if not found:
        raise SystemExit(f"{template}: no RDMA port with link_layer Ethernet and gid_attrs/ndevs/0")
    return found


def _pci_of(template: Path, netdev: str) -> str:
    uevent = template / NET / netdev / "device" / "uevent"
    m = re.search(r"^PCI_SLOT_NAME=(\S+)", uevent.read_text(), re.M) if uevent.is_file() else None
    return m.group(1) if m else ""


def _copy_tree(src: Path, dst: Path, subst: dict[str, str]) -> int:
    """Copy a folder, renaming path parts and replacing whole words in text files, in one pass
    (so that a replacement is never replaced again)."""
    pattern = re.compile("|".join(rf"(?<![\w.:]){re.escape(k)}(?![\w.:])" for k in subst)) if subst else None
    files = 0
    for dirpath, _dirs, names in os.walk(src, followlinks=False):
        rel = Path(dirpath).relative_to(src)
        for name in names:
            s = Path(dirpath) / name
            d = dst / Path(*(subst.get(part, part) for part in rel.parts)) / subst.get(name, name)
            d.parent.mkdir(parents=True, exist_ok=True)
            if s.is_symlink():
                d.symlink_to(os.readlink(s))
            else:
                data = s.read_bytes()
                try:
                    text = data.decode()
                except UnicodeDecodeError:
                    d.write_bytes(data)
                else:
                    d.write_text(pattern.sub(lambda m: subst[m.group(0)], text) if pattern else text)
            files += 1
    return files


def from_template(template: Path, out: Path, ports: int = 8) -> int:
    """Port i of the new node is a copy of the template's RoCE port i mod (their number),
    renamed ens<i+1>f0np0 / mlx5_<i>, with its own PCI address and NUMA node. The
    template's other netdevs (management NIC, lo) and proc/ are copied as they are."""
    tports = _template_ports(template)
    files = 0
    for i in range(ports):
        netdev0, rdma0 = tports[i % len(tports)]
        netdev, rdma, pci, numa = port_names(i)
        pci0 = _pci_of(template, netdev0)
        subst = {netdev0: netdev, rdma0: rdma, **({pci0: pci} if pci0 else {})}
        files += _copy_tree(template / NET / netdev0, out / NET / netdev, subst)
        files += _copy_tree(template / IB / rdma0, out / IB / rdma, subst)
        for numa_file in (out / NET / netdev / "device" / "numa_node", out / IB / rdma / "device" / "numa_node"):
            if numa_file.is_file() and not numa_file.is_symlink():
                numa_file.write_text(f"{numa}\n")
        src_eth = template / "ethtool" / f"{netdev0}.txt"
        if src_eth.is_file():
            (out / "ethtool").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src_eth, out / "ethtool" / f"{netdev}.txt")
            files += 1
    roce = {n for n, _ in tports}
    for name in sorted(os.listdir(template / NET)) if (template / NET).is_dir() else []:
        if name not in roce:
            files += _copy_tree(template / NET / name, out / NET / name, {})
            if (template / "ethtool" / f"{name}.txt").is_file():
                (out / "ethtool").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(template / "ethtool" / f"{name}.txt", out / "ethtool" / f"{name}.txt")
                files += 1
    for rel in ("proc/net/snmp", "proc/net/netstat"):
        if (template / rel).is_file():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(template / rel, out / rel)
            files += 1
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", help="folder to write the node into (must be absent or empty)")
    p.add_argument("--ports", type=int, default=8, help="number of mlx5 RoCE ports (default 8)")
    p.add_argument("--channels", type=int, default=32, help="channels per port in ethtool -S (default 32)")
    p.add_argument("--template", metavar="DIR", help="replicate the first mlx5 RoCE port of this fixture node "
                   "instead of generating from scratch (e.g. tests/fixtures/nodes/roce-mlx5)")
    p.add_argument("--no-gpus", action="store_true", help="write no nvml.json (a node without GPUs)")
    p.add_argument("--seed", type=int, default=20240611)
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    if out.exists() and any(out.iterdir()):
        print(f"make_fixture: {out} is not empty", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if args.template:
        n = from_template(Path(args.template), out, args.ports)
        how = f"replicated from {args.template}"
    else:
        n = generate(out, args.ports, args.channels, args.seed, gpus=not args.no_gpus)
        how = f"generated, {args.channels} channels per port"
    print(f"wrote {n} files to {out}: {args.ports} mlx5 RoCE ports, {how}; a static snapshot "
          "(counters do not advance)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
