"""Live network tests: the real exporter, real traffic, real kernel counters. No mocks.

Two network namespaces, A and B (named after this process's pid), are joined by a veth
pair: gva (198.18.0.1/30) in A, gvb (198.18.0.2/30) in B. A's egress is shaped to
200 Mbit/s with tbf, and the exporter runs inside A, told that gva is a 200 Mbit link of
the training fabric. iperf3 drives TCP from A to B; the kernel's own counters (sysfs,
nstat) and iperf3's report are the references the exporter is checked against.

Each test gets fresh namespaces and a fresh exporter (so the per-namespace kernel counters
start quiet), and the fixture's finalizer kills every process inside them by pid and
deletes them, whatever the test did (test 3 deletes the veth itself).

Run: pytest -m netns tests/test_live_network.py -s   (root; ip, tc, nft, iperf3, curl, nstat)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns as nx  # noqa: E402
from procs import wait_for  # noqa: E402

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(nx.why_not_runnable() is not None, reason=nx.why_not_runnable() or "")]

RATE_MBIT = 200
IPERF_PORT = 5201
DEV = "gva"

TX = "gpunet_nic_transmit_bytes_total"
SAT = "gpunet_nic_saturated_seconds_total"
STATE = "gpunet_node_network_state_seconds_total"
BURSTS = "gpunet_node_network_bursts_total"
RETRANS = "gpunet_tcp_retransmitted_segments_total"
SENT = "gpunet_tcp_sent_segments_total"


@pytest.fixture
def lab():
    lab = nx.make_lab(RATE_MBIT)
    yield lab
    lab.close()


@pytest.fixture
def exporter(lab, tmp_path):
    exp = nx.Exporter(lab.a, [f"--link-speed={DEV}={RATE_MBIT}Mbit", f"--nic-include=^{DEV}$",
                              f"--fabric-devices={DEV}"], tmp_path / "exporter.log")
    lab.cleanups.append(exp.stop)  # runs before the namespaces go, even if the test failed
    exp.wait_healthy()
    # Two fast ticks have run once the saturated-seconds series exists (it needs a rate).
    exp.wait_for(lambda s: s.get(SAT, device=DEV, direction="transmit") is not None
                 and s.get(RETRANS) is not None, what="gva and tcp series")
    return exp


def pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b


def nothing_left_for_b(lab) -> bool:
    """A sends B nothing more: each of A's TCP sockets to B is gone or done sending (TIME-WAIT,
    or FIN-WAIT-2: its FIN acknowledged), so nothing is left to retransmit, and the shaper's
    queue on gva is empty."""
    sockets = lab.a.run(["ss", "-Htan", "dst", nx.ADDR_B]).stdout.splitlines()
    qdisc = lab.a.run(["tc", "-s", "qdisc", "show", "dev", DEV]).stdout
    return {line.split()[0] for line in sockets if line.strip()} <= {"TIME-WAIT", "FIN-WAIT-2"} \
        and " backlog 0b 0p" in qdisc


def wait_sent(lab) -> None:
    wait_for(lambda: nothing_left_for_b(lab), timeout=30, what="A's sockets to B done and gva's queue drained")


def test_bytes_and_saturation(lab, exporter):
    before = exporter.scrape()
    kernel_before = lab.tx_bytes()

    result = nx.iperf3(lab.a, lab.b, nx.ADDR_B, 4, IPERF_PORT)
    sent_bytes = result["end"]["sum_sent"]["bytes"]
    received_bytes = result["end"]["sum_received"]["bytes"]
    duration = result["end"]["sum_sent"]["seconds"]
    wait_sent(lab)
    after = exporter.wait_ticks(fast=2)  # fast ticks that read the final counters (and judged the link idle)
    kernel_delta = lab.tx_bytes() - kernel_before
    exp_delta = after.value(TX, device=DEV) - before.value(TX, device=DEV)
    sat_delta = (after.value(SAT, device=DEV, direction="transmit")
                 - before.value(SAT, device=DEV, direction="transmit"))
    state_delta = (after.value(STATE, network_state="saturated")
                   - before.value(STATE, network_state="saturated"))

    # Control phase: the link idles for 10 fast ticks (2 s); nothing may count as saturated.
    idle = exporter.wait_ticks(fast=10)
    idle_sat = (idle.value(SAT, device=DEV, direction="transmit")
                - after.value(SAT, device=DEV, direction="transmit"))
    idle_state = idle.value(STATE, network_state="saturated") - after.value(STATE, network_state="saturated")
    idle_quiet = idle.value(STATE, network_state="quiet") - after.value(STATE, network_state="quiet")

    print(f"\n[bytes] kernel tx delta {kernel_delta} B, exporter tx delta {exp_delta:.0f} B "
          f"({pct(exp_delta, kernel_delta):+.3f}%); iperf3 sent {sent_bytes} B in {duration:.3f} s "
          f"({sent_bytes * 8 / duration / 1e6:.1f} Mbit/s), received {received_bytes} B; "
          f"wire vs iperf3 sent {pct(exp_delta, sent_bytes):+.2f}%, vs received {pct(exp_delta, received_bytes):+.2f}%")
    print(f"[saturation] saturated {sat_delta:.3f} s vs iperf3 {duration:.3f} s "
          f"({pct(sat_delta, duration):+.1f}%); network_state=saturated +{state_delta:.3f} s; "
          f"idle 10 ticks: saturated +{idle_sat:.3f} s, state saturated +{idle_state:.3f} s, quiet +{idle_quiet:.3f} s")

    assert received_bytes > 0.8 * RATE_MBIT * 1e6 / 8 * duration, "TCP ran far below the shaped rate"
    assert abs(exp_delta - kernel_delta) <= 0.01 * kernel_delta, "exporter tx bytes disagree with the kernel"
    # iperf3's sum_sent counts what its client write()s into the socket, not what left it:
    # at the end of the test the iperf3 server closes the data stream while A still holds up
    # to a send buffer of unsent data (TcpEstabResets goes up in A), and that data never
    # reaches the wire, so sum_sent can exceed the wire count by ~1%. What the receiver got
    # (sum_received) did cross gva once, headers on top: that is the hard lower bound.
    assert exp_delta >= received_bytes, "the wire carried less than iperf3's receiver got"
    assert abs(exp_delta - sent_bytes) <= 0.05 * sent_bytes, "wire bytes and iperf3's bytes sent differ > 5%"
    assert abs(sat_delta - duration) <= 0.25 * duration, "saturated seconds do not match the shaped transfer"
    assert abs(state_delta - duration) <= 0.25 * duration, "network_state=saturated does not match the transfer"
    assert idle_sat == 0, "saturated seconds grew on an idle link"
    assert idle_state == 0, "network_state=saturated grew on an idle link"
    assert idle_quiet >= 1.5, "an idle fabric link did not count as quiet"


def test_bursts_count_transfers(lab, exporter):
    # Three transfers separated by idle gaps: three quiet -> busy transitions of the fabric.
    before = exporter.scrape().value(BURSTS)
    transfers = 3
    for _ in range(transfers):
        nx.iperf3(lab.a, lab.b, nx.ADDR_B, 1, IPERF_PORT)
        wait_sent(lab)
        exporter.wait_ticks(fast=3)  # quiet fast ticks between transfers
    delta = exporter.scrape().value(BURSTS) - before
    print(f"\n[bursts] {transfers} iperf3 transfers of 1 s, bursts counted {delta:.0f}")
    assert delta == transfers


NFT_LOSS = """
table inet gpunet_loss {{
    chain prerouting {{
        type filter hook prerouting priority -300; policy accept;
        ip saddr {src} tcp dport {port} numgen random mod 100 < 2 drop
    }}
}}
"""


def test_retransmits(lab, exporter):
    lab.b.run(["nft", "-f", "-"], input=NFT_LOSS.format(src=nx.ADDR_A, port=IPERF_PORT))
    nstat_before = lab.a.nstat("TcpRetransSegs")
    exp_before = exporter.scrape().value(RETRANS)

    result = nx.iperf3(lab.a, lab.b, nx.ADDR_B, 3, IPERF_PORT)
    # A dropped FIN is retransmitted after an RTO (>= 200 ms): wait until A has nothing left
    # to retransmit, then for a slow tick (which reads the TCP counters) after that.
    wait_sent(lab)
    exp_after = exporter.wait_ticks(slow=1).value(RETRANS)
    nstat_after = lab.a.nstat("TcpRetransSegs")
    nstat_delta = nstat_after - nstat_before
    exp_delta = exp_after - exp_before
    dropped = lab.b.run(["nft", "list", "table", "inet", "gpunet_loss"]).stdout
    print(f"\n[retransmits] nstat TcpRetransSegs delta {nstat_delta}, exporter delta {exp_delta:.0f}, "
          f"iperf3 retransmits {result['end']['sum_sent'].get('retransmits')}, "
          f"throughput {result['end']['sum_sent']['bits_per_second'] / 1e6:.1f} Mbit/s")

    assert "drop" in dropped
    assert nstat_delta > 0, "2% loss caused no TCP retransmits at all: the nft rule did not bite"
    assert exp_delta > 0
    assert abs(exp_delta - nstat_delta) <= 2, "exporter retransmits disagree with the kernel's TcpRetransSegs"


def test_nic_removal(lab, exporter):
    before = exporter.scrape()
    assert before.with_label("device", DEV), "no gva series before the removal"

    lab.a.run(["ip", "link", "del", DEV])
    started = time.monotonic()
    after = exporter.wait_for(lambda s: not s.with_label("device", DEV), timeout=3.0,
                              what="scrape without device=gva series")
    gone_after = time.monotonic() - started
    later = exporter.wait_ticks(fast=3, slow=1)  # more ticks after the removal: still up, still without gva
    print(f"\n[removal] gva series gone {gone_after:.2f} s after `ip link del`")

    assert later.status == 200
    assert not later.with_label("device", DEV), f"gva series came back: {later.with_label('device', DEV)}"
    assert after.has(SENT) and later.has(SENT), "node TCP counters vanished with the NIC"
    assert exporter.proc.poll() is None, f"exporter died:\n{exporter.log()}"
    assert exporter.get("/healthz")[0] == 200


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (prometheus) not installed")
def test_promtool_check_metrics(lab, exporter):
    # Some traffic first, so every counter family has moved and carries real values.
    nx.iperf3(lab.a, lab.b, nx.ADDR_B, 1, IPERF_PORT)
    exporter.wait_ticks(slow=1)  # a slow tick read the counters after the traffic
    status, body = exporter.get("/metrics")
    assert status == 200
    assert body.startswith("# HELP")
    proc = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True,
                          timeout=30)
    problems = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and not problems, f"promtool check metrics (rc {proc.returncode}):\n{problems}"


IDLE = "gpunet_gpu_idle_seconds_total"
BUSY = "gpunet_gpu_busy_seconds_total"


def test_gpu_idle_split_by_real_network_state(lab, tmp_path):
    """GPUs read from a fixture (30% busy), the network for real: while iperf3 fills the
    shaped veth, idle time lands in `saturated`; before and after, in `quiet`."""
    gpus = tmp_path / "nvml.json"
    gpus.write_text(json.dumps({"driver_version": "550.90.07", "gpus": [
        {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:1{i}:00.0",
         "numa_node": 0, "utilization_gpu": 30, "sm_clock_hz": 1980000000, "clock_event_reasons": []}
        for i in range(2)]}))
    exp = nx.Exporter(lab.a, [f"--link-speed={DEV}={RATE_MBIT}Mbit", f"--nic-include=^{DEV}$",
                              f"--fabric-devices={DEV}", f"--gpu-fixture={gpus}"], tmp_path / "exporter.log")
    lab.cleanups.append(exp.stop)
    exp.wait_healthy()
    exp.wait_for(lambda s: s.get(IDLE, gpu="1", network_state="quiet") is not None, what="GPU idle series")
    exp.wait_ticks(fast=5)  # a second of quiet fast ticks with the GPUs read

    def split(scrape):
        return {state: scrape.value(IDLE, gpu="0", network_state=state)
                for state in ("paused", "saturated", "active", "quiet")}

    first = exp.scrape()
    quiet_phase, busy_before = split(first), first.value(BUSY, gpu="0")
    t0 = time.monotonic()
    result = nx.iperf3(lab.a, lab.b, nx.ADDR_B, 3, IPERF_PORT)
    during = split(exp.scrape())
    wait_sent(lab)
    after_scrape = exp.wait_ticks(fast=10)  # 2 s of quiet fast ticks once the queue drained
    after, elapsed = split(after_scrape), time.monotonic() - t0
    duration = result["end"]["sum_sent"]["seconds"]

    saturated = during["saturated"] - quiet_phase["saturated"]
    print(f"\n[gpu idle] during iperf3 ({duration:.2f} s): saturated +{saturated:.3f} s, quiet "
          f"+{during['quiet'] - quiet_phase['quiet']:.3f} s; after: quiet +{after['quiet'] - during['quiet']:.3f} s")
    assert quiet_phase["quiet"] > 0 and quiet_phase["saturated"] == 0, quiet_phase
    # 70% of the time GPUs were idle, and the network was saturated for (about) the transfer.
    assert abs(saturated - 0.7 * duration) <= 0.25 * 0.7 * duration, saturated
    assert after["saturated"] == during["saturated"], "idle counted as saturated after traffic stopped"
    # After the transfer the shaper's queue drained, then came 9 whole fast ticks, quiet (about
    # 1.8 s, 1.6 s at the least, whatever the load): GPUs idle 70% of them, with the network quiet.
    assert after["quiet"] - during["quiet"] >= 0.7 * 1.2
    # The invariant: busy + all idle states grew by the wall time (scrapes bracket it loosely).
    busy = after_scrape.value(BUSY, gpu="0") - busy_before
    idle = sum(after.values()) - sum(quiet_phase.values())
    assert busy == pytest.approx(0.3 * elapsed, rel=0.15), (busy, elapsed)
    assert busy + idle == pytest.approx(elapsed, rel=0.1), (busy, idle, elapsed)
