"""`gpunet-exporter snapshot OUT_DIR`: write this node as a fixture folder (tests/fixtures/nodes/README.md).

The folder holds every file the exporter reads, copied, plus the driver statistics in
the text form of `ethtool -S`, so a user can attach their node to a bug report and the
exporter run with `--root OUT_DIR` shows the same counters.

Each file is read as the daemon reads it: at most MAX_READ bytes (exporter/root.py) and
under a time limit (exporter/bounded.py), so that a FIFO, a device or a driver stuck in a
read costs that file only. A file that cannot be copied is skipped with one line that names
it and says why; one that does not exist is skipped without a word (most are optional).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from exporter.bounded import BoundedCalls, Hung
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
# Seconds a file may take to read (the daemon's slow tick gives a collector as long), and the
# GPU backend to answer for all its GPUs (opening NVML on a node without persistence mode
# takes seconds).
READ_TIMEOUT = 2.0
GPU_TIMEOUT = 20.0
log = logging.getLogger("gpunet.exporter")


class Stuck(SourceError):
    """A read (or a call) that did not answer within its time limit."""


def _bounded(calls: BoundedCalls, key: Hashable, timeout: float, where: str, fn: Callable[..., Any],
             *args: object) -> Any:
    """fn(*args) under a time limit; Stuck where it hangs."""
    got = calls.call(key, timeout, fn, *args)
    if isinstance(got, Hung):
        raise Stuck(where, f"no answer within {timeout:g} s")
    if isinstance(got, Exception):
        raise got
    return got


class _BoundedRoot(Root):
    """The node's files, each read under READ_TIMEOUT (and MAX_READ, as every Root read)."""

    def __init__(self, path: str | os.PathLike, calls: BoundedCalls):
        super().__init__(path)
        self._max_open = 0  # read once or twice each: none kept open
        self._calls = calls

    def _read(self, rel: str, missing_ok: bool = False) -> bytes | None:
        return _bounded(self._calls, rel, READ_TIMEOUT, self.where(rel), Root._read, self, rel, missing_ok)


class _Writer:
    def __init__(self, src: Root, out: Path):
        self.src, self.out, self.count = src, out, 0
        self._broken: list[str] = []  # folders skipped: nothing under them is tried again

    def text(self, rel: str, content: str) -> None:
        dest = self.out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(content)
        self.count += 1

    def skip(self, where: str, why: str) -> None:
        log.warning("snapshot: skipped %s: %s", where, why)

    def file(self, rel: str) -> None:
        """Copy one file: skipped, with a line, where it is no regular file (a FIFO or a device
        would hang or never end) or cannot be read; without one where it does not exist."""
        try:
            st = os.stat(self.src.where(rel))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:  # a symbolic link to itself, a folder that may not be read
            self.skip(self.src.where(rel), e.strerror or str(e))
            return
        if stat.S_ISDIR(st.st_mode):
            return
        if not stat.S_ISREG(st.st_mode):
            self.skip(self.src.where(rel), "not a regular file")
            return
        try:
            content = self.src.read_text(rel)
        except SourceError as e:  # write-only or EINVAL attributes, hung or too big files
            self.skip(e.where, e.what)
            return
        self.text(rel, content)

    def copy(self, rel_dir: str, patterns: tuple[str, ...]) -> None:
        if any(rel_dir == b or rel_dir.startswith(b + "/") for b in self._broken):
            return
        try:
            os.stat(self.src.where(rel_dir))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:  # a symbolic link to itself: one line for the folder, not one per file
            self._broken.append(rel_dir)
            self.skip(self.src.where(rel_dir), e.strerror or str(e))
            return
        for pattern in patterns:
            folder, _, name = pattern.rpartition("/")
            base = f"{rel_dir}/{folder}" if folder else rel_dir
            try:
                names = self.src.listdir(base) if name == "*" else [name]
            except SourceError as e:
                self.skip(e.where, e.what)
                continue
            for n in names:
                self.file(f"{base}/{n}")

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


def _write_driver_stats(src: Root, w: _Writer, calls: BoundedCalls, stats: DriverStatsReader, netdev: str) -> None:
    """The driver's statistics in the text `ethtool -S` prints. Live, a device without any (lo,
    a veth) says so by an error, which is not worth a line; a hang always is."""
    if not stats.available(netdev):
        return
    try:
        values = _bounded(calls, ("ethtool", netdev), READ_TIMEOUT, stats.where(netdev), stats.read, netdev, [])
    except SourceError as e:
        if not src.is_live or isinstance(e, Stuck):
            w.skip(e.where, e.what)
        return
    if values:
        lines = ["NIC statistics:"] + [f"     {k}: {v}" for k, v in values.items()]
        w.text(f"ethtool/{netdev}.txt", "\n".join(lines) + "\n")


def write_snapshot(src: Root, out_dir: str | os.PathLike, gpus=None) -> int:
    """Write the node's files under out_dir; `gpus`, a GPU backend, adds nvml.json."""
    out = Path(out_dir)
    calls = BoundedCalls("snapshot")
    try:
        return _write_all(_BoundedRoot(src.base, calls), out, calls, gpus)
    finally:
        calls.close()


def _write_all(src: Root, out: Path, calls: BoundedCalls, gpus: Any) -> int:
    w = _Writer(src, out)
    nics = discover(src, InventoryOptions(exclude=None), [])
    stats = DriverStatsReader(src)
    try:
        for nic in nics.values():
            if nic.netdev:
                w.copy(f"{NET}/{nic.netdev}", NETDEV_FILES)
                w.copy(f"{NET}/{nic.netdev}/device", PCI_FILES)
                _write_driver_stats(src, w, calls, stats, nic.netdev)
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
        w.file(rel)
    _write_bonds(src, w)
    if gpus is not None:
        hung = False
        try:
            doc = _bounded(calls, "gpus", GPU_TIMEOUT, f"GPU backend {type(gpus).__name__}", gpu_document, gpus)
            w.text("nvml.json", json.dumps(doc, indent=1) + "\n")
            for bus_id in (str(g.get("pci_bus_id") or "") for g in doc.get("gpus", [])):
                if bus_id:  # their PCIe links
                    w.copy(f"{PCI_DEVICES}/{normalize_pci(bus_id)}", PCI_FILES)
            _write_processes(src, w, doc)
        except SourceError as e:
            hung = isinstance(e, Stuck)
            log.warning("snapshot: no GPUs written: %s", e)
        finally:
            if not hung:  # closing NVML while a call hangs in it may hang too
                gpus.close()
    w.copy(SLURM_DIR, ("*",))
    return w.count
