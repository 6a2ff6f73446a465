"""`gpunet-exporter snapshot OUT_DIR`: write this node as a fixture folder (tests/fixtures/nodes/README.md).

The folder holds every file the exporter reads, copied, plus the driver statistics in
the text form of `ethtool -S`, so a user can attach their node to a bug report and the
exporter run with `--root OUT_DIR` shows the same counters.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from exporter.inventory import InventoryOptions, discover
from exporter.readers.bonding import MASTERS
from exporter.readers.dcb import read_dcb
from exporter.readers.ethtool import DriverStatsReader, read_pause
from exporter.readers.netdev import NET
from exporter.readers.nvml import normalize_pci
from exporter.readers.pci import PCI_DEVICES
from exporter.readers.processes import ENV_KEYS, environ
from exporter.readers.processes import FILES as PROCESS_FILES
from exporter.readers.procfs import NETSTAT, SNMP
from exporter.readers.rdma import IB
from exporter.readers.slurm_jobs import DEFAULT_DIR as SLURM_DIR
from exporter.root import Root, SourceError

NETDEV_FILES = ("speed", "operstate", "carrier", "carrier_changes", "mtu", "type", "address", "dev_port",
                "statistics/*")
PCI_FILES = ("uevent", "numa_node", "current_link_speed", "max_link_speed", "current_link_width",
             "max_link_width", "vendor", "device")
PORT_FILES = ("link_layer", "rate", "state", "phys_state", "gid_attrs/ndevs/0", "counters/*",
              "hw_counters/*", "counters_ext/*")
RDMA_DEVICE_FILES = ("node_type", "fw_ver", "hca_type", "board_id")
PROC_FILES = (SNMP, NETSTAT)
log = logging.getLogger("gpunet.exporter")


class _Writer:
    def __init__(self, src: Root, out: Path):
        self.src, self.out, self.count = src, out, 0

    def text(self, rel: str, content: str) -> None:
        dest = self.out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(content)
        self.count += 1

    def copy(self, rel_dir: str, patterns: tuple[str, ...]) -> None:
        for pattern in patterns:
            folder, _, name = pattern.rpartition("/")
            base = f"{rel_dir}/{folder}" if folder else rel_dir
            names = self.src.listdir(base) if name == "*" else [name]
            for n in names:
                rel = f"{base}/{n}"
                if not self.src.path(rel).is_file():
                    continue
                try:
                    self.text(rel, self.src.read_text(rel))
                except SourceError:
                    pass  # write-only or EINVAL attributes have no value to keep

    def keep(self, rel_dir: str) -> None:
        self.text(f"{rel_dir}/.keep", "")


def gpu_document(gpus) -> dict:
    """nvml.json (tests/fixtures/nodes/README.md) from an opened GPU backend's current readings."""
    doc = {"driver_version": gpus.open(), "gpus": []}
    xids = gpus.xid_counts()
    for ident in gpus.gpus():
        entry = {"index": ident.index, "uuid": ident.uuid, "name": ident.model, "pci_bus_id": ident.pci_address,
                 "numa_node": int(ident.numa_node) if ident.numa_node else None}
        try:
            activity = gpus.activity(ident.index)
            details = gpus.details(ident.index)
            health = gpus.health(ident.index)
        except SourceError as e:
            entry["nvml_error"] = str(e)
            doc["gpus"].append(entry)
            continue
        entry.update(utilization_gpu=round(activity.utilization * 100, 1), sm_clock_hz=activity.sm_clock_hz,
                     clock_event_reasons=sorted(activity.reasons), power_w=details.power_watts,
                     temperature_c=details.temperature_celsius, memory_used_bytes=details.memory_used_bytes,
                     memory_total_bytes=details.memory_total_bytes,
                     pcie_tx_bytes_per_second=details.pcie_transmit_bytes_per_second,
                     pcie_rx_bytes_per_second=details.pcie_receive_bytes_per_second, gpm=details.gpm,
                     xid_errors={str(x): n for (g, x), n in xids.items() if g == ident.index},
                     ecc_errors=health.ecc_errors, nvlink_errors=health.nvlink_errors,
                     row_remapping=None if health.remapped_rows is None else
                     {**health.remapped_rows, "pending": health.row_remap_pending,
                      "failed": health.row_remap_failed})
        try:
            entry.update(processes=[{"pid": p.pid, "used_memory_bytes": p.used_memory_bytes}
                                    for p in gpus.processes(ident.index)] or None,
                         mig_uuids=gpus.mig_uuids(ident.index) or None)
        except SourceError:
            pass  # workload attribution is lost, the readings are kept
        doc["gpus"].append({k: v for k, v in entry.items() if v is not None})
    return doc


def _write_processes(src: Root, w: _Writer, doc: dict) -> None:
    """What tells the GPUs' processes' jobs: cgroup and comm, and of environ only the keys
    the exporter reads (an environment may hold secrets; a bug report must not)."""
    for pid in sorted({p["pid"] for g in doc["gpus"] for p in g.get("processes", [])}):
        w.copy(f"proc/{pid}", PROCESS_FILES)
        if src.exists(f"proc/{pid}/environ"):
            kept = {k: v for k, v in environ(src, pid).items() if k in ENV_KEYS}
            w.text(f"proc/{pid}/environ", "".join(f"{k}={v}\0" for k, v in kept.items()))


def _write_qos(src: Root, w: _Writer, netdev: str) -> None:
    """PFC, trust and pause in the forms exporter/readers/{dcb,ethtool}.py read under a
    fixture root (what `dcb -j pfc|app show` and `ethtool -a` print), and mlx5's ECN files."""
    try:
        dcb = read_dcb(src, netdev)
        pause = read_pause(src, netdev)
    except SourceError as e:
        log.warning("snapshot: %s", e)
        dcb = pause = None
    if dcb is not None and dcb.pfc_enabled is not None:
        w.text(f"dcb/{netdev}.pfc.json", json.dumps({"prio_pfc": list(dcb.pfc_enabled)}) + "\n")
        w.text(f"dcb/{netdev}.app.json", json.dumps({"dscp_prio": [list(p) for p in dcb.dscp_prio]}) + "\n")
    if pause is not None:
        on = ("off", "on")
        w.text(f"ethtool/{netdev}.pause.txt",
               f"Pause parameters for {netdev}:\nRX:\t\t{on[pause[0]]}\nTX:\t\t{on[pause[1]]}\n")
    for point in ("roce_np", "roce_rp"):
        w.copy(f"{NET}/{netdev}/ecn/{point}/enable", ("*",))


def _write_bonds(src: Root, w: _Writer) -> None:
    names = (src.read_optional_str(MASTERS) or "").split()
    if not names:
        return
    w.text(MASTERS, " ".join(names) + "\n")
    for bond in names:
        w.copy(f"{NET}/{bond}/bonding", ("*",))
        for member in (src.read_optional_str(f"{NET}/{bond}/bonding/slaves") or "").split():
            w.copy(f"{NET}/{member}/bonding_slave", ("*",))


def write_snapshot(src: Root, out_dir: str | os.PathLike, gpus=None) -> int:
    """Write the node's files under out_dir; `gpus`, a GPU backend, adds nvml.json."""
    out = Path(out_dir)
    w = _Writer(src, out)
    nics = discover(src, InventoryOptions(exclude=None), [])
    stats = DriverStatsReader(src)
    try:
        for nic in nics.values():
            if nic.netdev:
                w.copy(f"{NET}/{nic.netdev}", NETDEV_FILES)
                w.copy(f"{NET}/{nic.netdev}/device", PCI_FILES)
                try:
                    values = stats.read(nic.netdev, [])
                except SourceError:
                    values = None
                if values:
                    lines = ["NIC statistics:"] + [f"     {k}: {v}" for k, v in values.items()]
                    w.text(f"ethtool/{nic.netdev}.txt", "\n".join(lines) + "\n")
                _write_qos(src, w, nic.netdev)
            if nic.rdma is not None:
                w.copy(nic.rdma.base, PORT_FILES)
                rdma_dir = f"{IB}/{nic.rdma.device}"
                w.copy(rdma_dir, RDMA_DEVICE_FILES)
                w.copy(f"{rdma_dir}/device", ("uevent", "numa_node"))
                if nic.netdev:
                    w.keep(f"{rdma_dir}/device/net/{nic.netdev}")
                else:
                    w.copy(f"{rdma_dir}/device", PCI_FILES)
                w.copy(f"sys/kernel/config/bnxt_re/{nic.rdma.device}/ports/{nic.rdma.port}/cc", ("*",))
                w.copy(f"sys/kernel/config/irdma/{nic.rdma.device}", ("*",))
    finally:
        stats.close()
    for rel in PROC_FILES:
        if src.exists(rel):
            w.text(rel, src.read_text(rel))
    _write_bonds(src, w)
    if gpus is not None:
        try:
            doc = gpu_document(gpus)
            w.text("nvml.json", json.dumps(doc, indent=1) + "\n")
            for bus_id in (str(g.get("pci_bus_id") or "") for g in doc.get("gpus", [])):
                if bus_id:  # their PCIe links
                    w.copy(f"{PCI_DEVICES}/{normalize_pci(bus_id)}", PCI_FILES)
            _write_processes(src, w, doc)
        except SourceError as e:
            log.warning("snapshot: no GPUs written: %s", e)
        finally:
            gpus.close()
    w.copy(SLURM_DIR, ("*",))
    return w.count
