"""What one node's exporter counts, as Prometheus scraped it.

For each node: the fast-tick state (saturation of each NIC, received pauses, hence
network_state, and GPU busy/idle split by it), the derived counters the exporter computes
from it, the counters it reads from the system (bytes, pauses, ECN, CNP, loss events, TCP),
and the gauges, all sampled at the node's scrapes (scrape.py).

Event counters (marks, CNPs, loss events, sent pauses, discards) are Poisson draws around
their physical expectation: a per-segment coefficient times what drives them (packets
received, seconds of link activity, or plain time). Received pauses are drawn per tick,
because they decide the tick's `paused` state, and then split over the node's NICs in
proportion to each NIC's expectation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpunet import contract as C
from gpunet.simulate import configfacts
from gpunet.simulate.cluster import Cluster, NicPort
from gpunet.simulate.conditions import GBN_TAIL, Timeline
from gpunet.simulate.params import SimSpec
from gpunet.simulate.physics import QUIET, Schedule, Ticks, gpu_busy_cumulative, network_state, piecewise_cumulative
from gpunet.simulate.scrape import NodeScrapes, derived_view

COLLECTORS = ("driver_stats", "gpu", "gpu_details", "inventory", "link_load", "netdev", "nic_info", "rdma",
              "tcp", "wire")
OOS_PER_LOSS = 4.0  # out-of-sequence packets a receiver counts per loss before the NAK turns it around
RDMA_BG_RATE = 20e3  # bytes/s of plain IP on each RDMA NIC (bootstrap, kube, ssh)
MGMT_BG_TX, MGMT_BG_RX = 0.3e6, 0.5e6  # bytes/s on the management NIC besides data reads and backups
DAY = 86400.0


@dataclass
class NodeSetup:
    """Per-node facts that are not conditions: confounders and link-down intervals."""
    used: np.ndarray  # (G,) GPUs the job runs on
    gpu_series: bool = True  # False: NVML broken, no GPU series at all
    spare_port: bool = False  # an extra RDMA port, down for the whole trace
    mgmt_tx: list[tuple[float, float, float]] = field(default_factory=list)  # (start, end, bytes/s) on eno1
    restarts: list[tuple[float, float]] = field(default_factory=list)  # exporter restarts (at, seconds down)
    window: tuple[float, float] | None = None  # monitoring join/leave
    downs: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # rail -> link-down intervals


@dataclass
class NodeOut:
    times: np.ndarray  # absolute Unix seconds of its scrapes
    series: dict[str, list[tuple[dict[str, str], np.ndarray]]]  # sample name -> [(labels, values)]


class NodeModel:
    def __init__(self, spec: SimSpec, cluster: Cluster, tl: Timeline, ticks: Ticks, sched: Schedule,
                 setups: list[NodeSetup]):
        self.spec, self.cluster, self.tl, self.ticks, self.sched, self.setups = spec, cluster, tl, ticks, sched, setups
        names = ("speed", "pause_rx", "pause_tx", "pause_tx_const", "xmit_wait", "ecn_frac", "ecn_burst", "loss", "tcp_loss",
                 "discards", "ack_timeout_const", "throttle", "clock", "loss_fabric", "tcp_loss_fabric")
        self.st = {n: tl.stack(n) for n in names}
        self._load_cache: dict[bytes, tuple] = {}

    # --- the fast tick -----------------------------------------------------------------------
    def _rail_load(self, i: int):
        """Per tick: which RDMA NICs ran >= 90% / >= 5% of their link speed. Every rank of a
        rail carries the same bytes, so nodes with the same speed history share the result."""
        speed = self.st["speed"][:, i, :]  # (segments, K)
        key = speed.tobytes()
        if key not in self._load_cache:
            tk = self.ticks
            sp = speed[tk.seg] * tk.dt  # (T, K) bytes a tick can carry at line rate
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(sp > 0, tk.rail_bytes / np.where(sp > 0, sp, 1.0), 0.0)
            sat = ratio >= C.SATURATED_RATIO
            cum_sat = np.zeros((len(tk.edges), sat.shape[1]))
            cum_sat[1:] = np.cumsum(sat, axis=0) * tk.dt
            self._load_cache[key] = (cum_sat, sat.any(axis=1), (ratio >= C.ACTIVE_RATIO).any(axis=1))
        return self._load_cache[key]

    def node(self, i: int, scr: NodeScrapes, rng: np.random.Generator) -> NodeOut:
        spec, tk, st, setup = self.spec, self.ticks, self.st, self.setups[i]
        f, job, cl = spec.fabric, spec.job, spec.cluster
        n_nodes, k_rails, n_gpus = cl.nodes, cl.nics, cl.gpus
        dt = tk.dt
        n_ticks = len(tk.edges) - 1
        kidx = scr.kidx
        t_rel = scr.times
        n = len(kidx)
        restart_k = np.array([min(int(r / dt), n_ticks) for r in scr.restarts], dtype=np.int64)
        kall = np.concatenate([kidx, restart_k])  # derived counters: at the scrapes and at each restart
        roce = job.transport == "rdma"
        tcp = not roce
        pkt = f.packet_bytes
        tcp_seg = f.tcp_mss + 52

        def seg_cum(coef, cum, at=kidx):  # (K', n) expected count
            return tk.seg_cumulative(coef, cum, at).T

        def poisson_cum(expected):  # (..., n) monotone draws around a cumulative expectation
            inc = np.diff(expected, axis=-1, prepend=0.0)
            return np.cumsum(rng.poisson(np.maximum(inc, 0.0)), axis=-1).astype(float)

        # --- fast tick: load, received pauses, state --------------------------------------
        cum_sat, node_sat, node_act = self._rail_load(i)
        pr = st["pause_rx"][:, i, :]
        lam = (pr[tk.seg] * tk.rail_active).sum(axis=1)
        pauses_tick = rng.poisson(lam)
        state = network_state(pauses_tick > 0, node_sat, node_act)

        busy = gpu_busy_cumulative(self.sched, i, tk.edges)  # (G, T+1)
        idle_tick = np.maximum(dt - np.diff(busy, axis=1), 0.0)
        idle_cum = np.zeros((n_gpus, 4, len(kall)))
        state_cum = np.zeros((4, len(kall)))
        for s in range(4):
            m = state == s
            cs = np.zeros(n_ticks + 1)
            cs[1:] = np.cumsum(m) * dt
            state_cum[s] = cs[kall]
            if n_gpus:
                ci = np.zeros((n_gpus, n_ticks + 1))
                ci[:, 1:] = np.cumsum(idle_tick * m, axis=1)
                idle_cum[:, s] = ci[:, kall]

        # quiet -> busier transitions, as the exporter counts them (gpunet_node_network_bursts_total)
        burst_cum = np.zeros(n_ticks + 1)
        burst_cum[1:] = np.cumsum((state != QUIET) & (np.concatenate(([QUIET], state[:-1])) == QUIET))
        burst_cum = burst_cum[kall]

        # --- initial values: the node ran (and its exporter ran) before the trace ----------
        uptime = rng.uniform(2, 30) * DAY
        exp_up = rng.uniform(0.5 / 24, min(uptime / DAY, 14)) * DAY
        line = cl.nic_speed

        # --- RDMA rails ----------------------------------------------------------------------
        bg = RDMA_BG_RATE * rng.uniform(0.5, 1.5, k_rails)
        rail_bytes = tk.cum_bytes[kidx].T + bg[:, None] * t_rel  # (K, n) each direction
        init_bytes = np.minimum(uptime * line * rng.uniform(0.1, 0.3, k_rails), 2e15)
        # received pauses: the per-tick draws, split over NICs by their expectation
        cum_cnt = np.concatenate([[0], np.cumsum(pauses_tick)])[kidx]
        n_int = np.diff(cum_cnt, prepend=0)
        share = np.diff(seg_cum(pr, tk.cum_active), axis=1, prepend=0.0).T  # (n, K)
        tot = share.sum(axis=1, keepdims=True)
        share = np.where(tot > 0, share / np.where(tot > 0, tot, 1), 1.0 / k_rails)
        rx_pauses = np.cumsum(rng.multinomial(n_int.astype(np.int64), share), axis=0).T.astype(float)
        tx_pauses = poisson_cum(seg_cum(st["pause_tx"][:, i, :], tk.cum_active)
                                + seg_cum(st["pause_tx_const"][:, i, :], tk.cum_time))
        marks = poisson_cum(seg_cum(st["ecn_frac"][:, i, :] / pkt, tk.cum_bytes)
                            + seg_cum(st["ecn_burst"][:, i, :], tk.cum_bursts))
        cnp_sent = np.cumsum(rng.binomial(np.diff(marks, axis=1, prepend=0.0).astype(np.int64), f.cnp_per_mark),
                             axis=1).astype(float)
        # CNPs come back from the ring successor, whose receiver marked what this node sent
        nxt = (i + 1) % n_nodes
        cnp_recv = poisson_cum(f.cnp_per_mark * (seg_cum(st["ecn_frac"][:, nxt, :] / pkt, tk.cum_bytes)
                                                 + seg_cum(st["ecn_burst"][:, nxt, :], tk.cum_bursts)))
        # InfiniBand: ticks in which a port had data but no credit from its peer
        xmit_wait = poisson_cum(seg_cum(st["xmit_wait"][:, i, :] / f.xmit_wait_tick, tk.cum_active)) \
            if f.infiniband else np.zeros((k_rails, n))
        loss = st["loss"]
        fab = st["loss_fabric"][:, None]
        p_in = loss[:, i, :] + loss[:, (i - 1) % n_nodes, :] + fab  # packets into i: i-1's uplink, i's downlink
        p_out = loss[:, i, :] + loss[:, (i + 1) % n_nodes, :] + fab
        oos = poisson_cum(seg_cum(OOS_PER_LOSS * p_in / pkt, tk.cum_bytes))
        seq_err = poisson_cum(seg_cum((1 - GBN_TAIL) * p_out / pkt, tk.cum_bytes))
        ack_to = poisson_cum(seg_cum(GBN_TAIL * p_out / pkt, tk.cum_bytes)
                             + (seg_cum(st["ack_timeout_const"][:, i, :], tk.cum_time) if roce else 0.0))
        crc = poisson_cum(seg_cum(loss[:, i, :] / pkt, tk.cum_bytes))
        discards = poisson_cum(seg_cum(st["discards"][:, i, :], tk.cum_time))

        # --- TCP: the management NIC always; the fabric too when the job runs over sockets ---
        mgmt_p = np.array(setup.mgmt_tx, dtype=float).reshape(-1, 3)
        mgmt_tx = MGMT_BG_TX * t_rel + piecewise_cumulative(mgmt_p[:, 0], mgmt_p[:, 1], mgmt_p[:, 2], t_rel)
        mgmt_rx = (MGMT_BG_RX + job.data_read_rate) * t_rel
        mgmt_segs = mgmt_tx / f.mgmt_mss + mgmt_rx / (2 * f.mgmt_mss) + (bg[:, None] * t_rel).sum(axis=0) / f.mgmt_mss
        out_segs = mgmt_segs
        retrans_exp = np.zeros(n)
        if tcp:  # data segments sent, plus one ACK per two received
            out_segs = out_segs + 1.5 * tk.cum_bytes[kidx].sum(axis=1) / tcp_seg
            p_tx = st["tcp_loss"][:, i, :] + st["tcp_loss_fabric"][:, None]
            retrans_exp = seg_cum(p_tx / tcp_seg, tk.cum_bytes).sum(axis=0)
        out_segs = np.round(out_segs)
        # storage and ssh over the management network retransmit now and then; the job's own
        # sockets on a well-provisioned fabric much less (a tenth of that ratio)
        fabric_segs = out_segs - mgmt_segs
        retrans = poisson_cum(retrans_exp + f.retrans_background * (mgmt_segs + 0.1 * fabric_segs))
        mgmt_sat = np.zeros((2, len(kall)))
        if len(mgmt_p):
            cum = MGMT_BG_TX * tk.edges + piecewise_cumulative(mgmt_p[:, 0], mgmt_p[:, 1], mgmt_p[:, 2], tk.edges)
            sat = np.diff(cum) >= C.SATURATED_RATIO * cl.mgmt_speed * dt
            mgmt_sat[1] = np.concatenate([[0], np.cumsum(sat) * dt])[kall]

        # --- link state: up, carrier changes, speed gauge --------------------------------------
        seg_now = tk.seg[np.minimum(kidx, n_ticks - 1)]
        speed_now = st["speed"][seg_now, i, :].T  # (K, n)
        up = np.ones((k_rails, n))
        carrier = np.zeros((k_rails, n))
        for k, downs in setup.downs.items():
            for a, b in downs:
                inside = (t_rel >= a) & (t_rel < b)
                up[k, inside] = 0.0
                carrier[k] += (t_rel >= a).astype(float) + (t_rel >= b)
        speed_now = np.where(up > 0, speed_now, np.nan)
        carrier_init = 2 * rng.integers(0, 3, k_rails + 1) + 1.0

        # --- assemble --------------------------------------------------------------------------
        series: dict[str, list] = {}

        def add(metric, labels, values):
            series.setdefault(metric, []).append((labels, np.asarray(values, dtype=float)))

        def derived(cum_all, init):  # cum_all: at the scrapes, then at each restart
            at_restarts = [cum_all[..., n + j] for j in range(len(restart_k))]
            return derived_view(cum_all[..., :n], at_restarts, t_rel, scr.restarts, init)

        ports: list[NicPort] = list(self.cluster.nics)
        mgmt = self.cluster.mgmt
        ones = np.ones(n)
        fabric_layer = "InfiniBand" if f.infiniband else "Ethernet"
        for p in ports + [mgmt] + ([self.cluster.spare_port()] if setup.spare_port else []):
            add(C.NIC_INFO.name, {"device": p.device, "rdma_device": p.rdma_device, "port": p.port,
                                  "driver": p.driver, "link_layer": "Ethernet" if p is mgmt else fabric_layer,
                                  "numa_node": configfacts.numa_of(self.spec, i, p),
                                  "pci_address": p.pci_address}, ones)
        for k, p in enumerate(ports):
            d = {"device": p.device}
            add(C.NIC_LINK_SPEED.name, d, speed_now[k])
            add(C.NIC_UP.name, d, up[k])
            add(C.NIC_CARRIER_CHANGES.name, d, carrier_init[k] + carrier[k])
            add(C.NIC_RECEIVE_BYTES.name, d, np.round(init_bytes[k] * 1.01 + rail_bytes[k]))
            add(C.NIC_TRANSMIT_BYTES.name, d, np.round(init_bytes[k] + rail_bytes[k]))
            if f.infiniband:  # credits, not pauses; no ECN marks or CNPs on the HCA
                add(C.NIC_TRANSMIT_WAIT.name, d,
                    np.round(uptime * 0.3 * f.xmit_wait_background / f.xmit_wait_tick * rng.uniform(0.3, 3))
                    + xmit_wait[k])
            for direction, cnt, rate in (() if f.infiniband else
                                         (("receive", rx_pauses[k], 0.05), ("transmit", tx_pauses[k], 0.005))):
                # RoCE pauses are PFC on the lossless priority; a TCP job has no lossless class,
                # so what can pause it is a link-level 802.3x pause ("global").
                pfc = np.round(uptime * rate * rng.uniform(0.3, 3))
                add(C.NIC_PFC_PAUSE_FRAMES.name, {**d, "direction": direction, "priority": f.pfc_priority},
                    pfc + (cnt if roce else 0 * ones))
                add(C.NIC_PFC_PAUSE_FRAMES.name, {**d, "direction": direction, "priority": "global"},
                    0 * ones if roce else cnt)
            if not f.infiniband:
                ecn_init = np.round(uptime * 20 * rng.uniform(0.3, 3)) if roce and f.ecn else 0.0
                add(C.NIC_ECN_MARKED.name, d, ecn_init + marks[k])
                add(C.NIC_CNP_SENT.name, d, np.round(ecn_init * f.cnp_per_mark) + cnp_sent[k])
                add(C.NIC_CNP_RECEIVED.name, d, np.round(ecn_init * f.cnp_per_mark * 0.97) + cnp_recv[k])
            for kind, cnt in (("out_of_sequence", oos[k]), ("sequence_error", seq_err[k]), ("ack_timeout", ack_to[k])):
                add(C.NIC_RDMA_LOSS_EVENTS.name, {**d, "kind": kind}, np.round(uptime * 2e-4 * rng.uniform(0, 2)) + cnt)
            add(C.NIC_RECEIVE_DISCARDS.name, d, float(rng.integers(0, 50)) + discards[k])
            add(C.NIC_RECEIVE_ERRORS.name, d, float(rng.integers(0, 4)) + crc[k])
            for direction in ("receive", "transmit"):
                add(C.NIC_SATURATED_SECONDS.name, {**d, "direction": direction},
                    derived(cum_sat[kall, k], exp_up * rng.uniform(0.05, 0.15)))
        # management NIC: storage, backups, checkpoints; no RDMA, no PFC
        d = {"device": mgmt.device}
        add(C.NIC_LINK_SPEED.name, d, cl.mgmt_speed * ones)
        add(C.NIC_UP.name, d, ones)
        add(C.NIC_CARRIER_CHANGES.name, d, carrier_init[-1] * ones)
        mgmt_init = min(uptime * 20e6, 1e15)
        add(C.NIC_RECEIVE_BYTES.name, d, np.round(mgmt_init * 3 + mgmt_rx))
        add(C.NIC_TRANSMIT_BYTES.name, d, np.round(mgmt_init + mgmt_tx))
        add(C.NIC_RECEIVE_DISCARDS.name, d, float(rng.integers(0, 2000)) * ones)
        add(C.NIC_RECEIVE_ERRORS.name, d, 0 * ones)
        for j, direction in enumerate(("receive", "transmit")):
            add(C.NIC_SATURATED_SECONDS.name, {**d, "direction": direction}, derived(mgmt_sat[j], 0.0))
        if setup.spare_port:  # cabled to nothing: down, no speed, counters frozen where they were
            sp = self.cluster.spare_port()
            d = {"device": sp.device}
            add(C.NIC_UP.name, d, 0 * ones)
            add(C.NIC_CARRIER_CHANGES.name, d, 0 * ones)
            add(C.NIC_RECEIVE_BYTES.name, d, 0 * ones)
            add(C.NIC_TRANSMIT_BYTES.name, d, 0 * ones)
            for direction in () if f.infiniband else ("receive", "transmit"):
                for prio in (f.pfc_priority, "global"):
                    add(C.NIC_PFC_PAUSE_FRAMES.name, {**d, "direction": direction, "priority": prio}, 0 * ones)
            for m in ((C.NIC_TRANSMIT_WAIT,) if f.infiniband else (C.NIC_ECN_MARKED, C.NIC_CNP_SENT, C.NIC_CNP_RECEIVED)) \
                    + (C.NIC_RECEIVE_DISCARDS, C.NIC_RECEIVE_ERRORS):
                add(m.name, d, 0 * ones)
            for kind in C.RDMA_LOSS_KINDS:
                add(C.NIC_RDMA_LOSS_EVENTS.name, {**d, "kind": kind}, 0 * ones)

        add(C.TCP_SENT.name, {}, np.round(uptime * 3000) + out_segs)
        add(C.TCP_RETRANSMITTED.name, {}, np.round(uptime * 3000 * f.retrans_background) + retrans)
        state_init = exp_up * np.array([0.01, 0.12, 0.25, 0.62])
        for s, name in enumerate(C.NETWORK_STATES):
            add(C.NODE_NETWORK_STATE_SECONDS.name, {"network_state": name}, derived(state_cum[s], state_init[s]))
        add(C.NODE_NETWORK_BURSTS.name, {}, np.round(derived(burst_cum, np.round(exp_up * 0.5))))

        # --- GPUs ---------------------------------------------------------------------------------
        if setup.gpu_series and n_gpus:
            self._gpus(i, setup, rng, add, derived, busy, idle_cum, kidx, kall, n, exp_up, seg_now)
        configfacts.emit(spec, ports + ([self.cluster.spare_port()] if setup.spare_port else []), mgmt,
                         self.cluster.gpus[i] if setup.gpu_series else [], i, setup.used, n, add)
        for col in COLLECTORS:
            ok = setup.gpu_series or col not in ("gpu", "gpu_details")
            add(C.COLLECTOR_UP.name, {"collector": col}, (1.0 if ok else 0.0) * ones)
        return NodeOut(self.spec.start_time + t_rel, series)

    def _gpus(self, i, setup, rng, add, derived, busy, idle_cum, kidx, kall, n, exp_up, seg_now):
        st, tk, cl = self.st, self.ticks, self.spec.cluster
        ones = np.ones(n)
        n_gpus = cl.gpus
        # NVML utilization: the share of the last ~1 s in which a kernel ran, in whole percent
        k0 = np.maximum(kidx - 5, 0)
        span = np.maximum(kidx - k0, 1) * tk.dt
        util = np.round((busy[:, kidx] - busy[:, k0]) / span * 100) / 100
        # throttle reasons: the fault's duty cycle, plus an occasional power cap under load
        duty = st["throttle"][:, i].reshape(len(self.tl.conds), -1)  # (segments, G*R)
        thr = self.ticks.seg_cumulative(duty, tk.cum_time, kall).T.reshape(n_gpus, len(C.THROTTLE_REASONS), -1)
        bg_cap = rng.uniform(0.0, 0.03, n_gpus)
        thr[:, C.THROTTLE_REASONS.index("sw_power_cap")] += bg_cap[:, None] * busy[:, kall]
        clock = st["clock"][seg_now, i, :].T * cl.gpu_clock_hz  # (G, n)
        dip = rng.random((n_gpus, n)) < bg_cap[:, None] * 3
        clock = np.round(clock * np.where(dip, 0.92, 1.0) * (1 - rng.uniform(0, 0.01, (n_gpus, n))) / 1e6) * 1e6
        clock = np.where(setup.used[:, None], clock, 345e6)  # a GPU nobody uses idles at its lowest clock
        idle_init = exp_up * np.array([0.005, 0.06, 0.04, 0.025])
        for g, dev in enumerate(self.cluster.gpus[i]):
            d = {"gpu": dev.index}
            used = bool(setup.used[g])
            add(C.GPU_INFO.name, {**d, "uuid": dev.uuid, "model": cl.gpu_model, "pci_address": dev.pci_address,
                                  "numa_node": dev.numa_node}, ones)
            add(C.GPU_UP.name, d, ones)
            add(C.GPU_UTILIZATION.name, d, util[g])
            add(C.GPU_SM_CLOCK.name, d, clock[g])
            busy_init = exp_up * 0.87 if used else 0.0
            add(C.GPU_BUSY_SECONDS.name, d, derived(busy[g, kall], busy_init))
            for s, name in enumerate(C.NETWORK_STATES):
                init = idle_init[s] if used else exp_up / 4
                add(C.GPU_IDLE_SECONDS.name, {**d, "network_state": name}, derived(idle_cum[g, s], init))
            for r, reason in enumerate(C.THROTTLE_REASONS):
                init = busy_init * bg_cap[g] if reason == "sw_power_cap" else 0.0
                add(C.GPU_THROTTLED_SECONDS.name, {**d, "reason": reason}, derived(thr[g, r], init))
