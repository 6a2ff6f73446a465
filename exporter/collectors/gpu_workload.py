"""Slow tick: which workload uses each GPU, as ``gpunet_gpu_workload_info{gpu, workload,
source, namespace, pod, container} = 1``, joinable on ``gpu`` with every GPU series (no other
series carries these labels). Empty string where a label does not apply.

Sources, by precedence: a GPU that an earlier source attributes gets that source's rows only.
1. kubernetes: the kubelet's PodResources API (readers/kubelet.py). ``workload`` is
   ``<namespace>/<job>``, ``<job>`` the pod name less the suffixes that tell a job's pods
   apart (``pod_pattern``), so the pods of a PyTorchJob or MPIJob share one workload, and
   ``workload`` alone is unique across namespaces; pod and container are the pod's.
2. slurm: the job-mapping folder a Slurm prolog writes (readers/slurm_jobs.py);
   ``workload`` is the job id, the key sacct and squeue take.
3. the GPU's compute processes (NVML) and their proc files (readers/processes.py): Slurm
   cgroup or environment -> slurm; kubepods cgroup -> kubernetes with the pod UID; else
   process, with torchrun's run id or the command name.

Registered with refresh="workload": the sampler runs it every ``interval`` seconds
(default 10) through exporter/refresh.py, so the kubelet is asked no more often than that;
in between, the last answer and its errors are served. A source not configured whose
socket or folder is absent is off, silently; one configured (or present) that fails is an
error naming it, and the other sources' rows are still served.
"""

from __future__ import annotations

import re

from exporter.bounded import BoundedCalls, Hung
from exporter.collector_registry import register
from exporter.collectors.gpu import as_source_error
from exporter.readers.gpus import GpuSource
from exporter.readers.kubelet import PodDevice, PodResources, socket_path
from exporter.readers.processes import owner
from exporter.readers.slurm_jobs import jobs_folder, read_jobs
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from exporter.workload_options import WorkloadOptions, compile_pod_pattern
from gpunet.contract import GPU_WORKLOAD_INFO


def pod_workload(pattern: re.Pattern, pod: str) -> str:
    m = pattern.search(pod)
    return (m.group("workload") if m else None) or pod


Row = tuple[str, str, str, str, str]  # workload, source, namespace, pod, container


class GpuWorkloadCollector:
    name = "gpu_workload"

    def __init__(self, source: GpuSource, root: Root, options: WorkloadOptions | None = None,
                 nvml_timeout: float = 0.5):
        self.source = source
        self.root = root
        self.options = options or WorkloadOptions()
        self.pattern = compile_pod_pattern(self.options.pod_pattern)
        self.nvml_timeout = nvml_timeout
        self.kubelet = PodResources(socket_path(root, self.options.kubelet_socket))
        self.slurm_dir = jobs_folder(root, self.options.slurm_dir)
        self.nvml_calls = BoundedCalls("gpunet-nvml-workload")
        self.kubelet_calls = BoundedCalls("gpunet-kubelet")

    def close(self) -> None:
        self.nvml_calls.close()
        self.kubelet_calls.close()
        self.kubelet.close()

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        """One read of every source; the sampler runs it every `interval` (exporter/refresh.py)."""
        self.source.ensure_open()
        backend = self.source.backend
        indices = [g.index for g in self.source.identities]
        by_id: dict[str, int] = {g.uuid: g.index for g in self.source.identities if g.uuid}
        results = self.nvml_calls.run({i: (lambda i=i: (backend.processes(i), backend.mig_uuids(i)))
                                       for i in indices}, timeout=self.nvml_timeout)
        pids: dict[int, list[int]] = {}
        for i in indices:
            result = results.get(i)
            if isinstance(result, tuple):
                procs, migs = result
                pids[i] = [p.pid for p in procs]
                by_id.update(dict.fromkeys(migs, i))
            else:
                errors.append(as_source_error(result, i))
        by_id.update({str(i): i for i in indices})
        sources = (self._kubernetes(by_id, errors), self._slurm(by_id, errors), self._processes(pids))
        samples = []
        for i in indices:
            rows = next((s[i] for s in sources if s.get(i)), set())
            samples.extend(Sample(GPU_WORKLOAD_INFO, (str(i), *row), 1.0) for row in sorted(rows))
        return samples

    def _kubernetes(self, by_id: dict[str, int], errors: list[SourceError]) -> dict[int, set[Row]]:
        if not self.kubelet.exists():
            if self.options.kubelet_socket is not None:
                errors.append(SourceError(self.kubelet.where(), "no such socket (--workload.kubelet-socket)"))
            return {}
        timeout = self.options.kubelet_timeout
        result = self.kubelet_calls.run({"list": lambda: self.kubelet.gpu_devices(timeout)},
                                        timeout=timeout + 0.5)["list"]
        if isinstance(result, Hung):
            errors.append(SourceError(self.kubelet.where(), f"List hung: {result}"))
            return {}
        if isinstance(result, SourceError):
            errors.append(result)
            return {}
        if isinstance(result, Exception):
            errors.append(SourceError(self.kubelet.where(), repr(result)))
            return {}
        rows: dict[int, set[Row]] = {}
        device: PodDevice
        for device in result:
            gpu = by_id.get(device.device_id.split("::", 1)[0])  # <uuid>::<n>: a time-sliced replica
            if gpu is None:
                errors.append(SourceError(self.kubelet.where(),
                                          f"pod {device.namespace}/{device.pod} container {device.container}: "
                                          f"{device.resource} device {device.device_id!r} is no GPU NVML lists "
                                          f"on this node"))
                continue
            workload = f"{device.namespace}/{pod_workload(self.pattern, device.pod)}"
            rows.setdefault(gpu, set()).add((workload, "kubernetes", device.namespace, device.pod,
                                             device.container))
        return rows

    def _slurm(self, by_id: dict[str, int], errors: list[SourceError]) -> dict[int, set[Row]]:
        if not self.slurm_dir.exists(""):
            if self.options.slurm_dir is not None:
                errors.append(SourceError(str(self.slurm_dir.base), "no such folder (--workload.slurm-dir)"))
            return {}
        rows: dict[int, set[Row]] = {}
        for job in read_jobs(self.slurm_dir, errors):
            unknown = [g for g in job.gpus if g not in by_id]
            if unknown:
                errors.append(SourceError(job.where, f"gpus: {unknown[0]!r} is no GPU NVML lists on this node"))
                continue
            for gpu in (by_id[g] for g in job.gpus):
                rows.setdefault(gpu, set()).add((job.job_id, "slurm", "", "", ""))
        return rows

    def _processes(self, pids: dict[int, list[int]]) -> dict[int, set[Row]]:
        rows: dict[int, set[Row]] = {}
        for gpu, gpu_pids in pids.items():
            for pid in gpu_pids:
                found = owner(self.root, pid)
                if found is not None:
                    rows.setdefault(gpu, set()).add((found.workload, found.source, "", "", ""))
        return rows


register("gpu_workload", "slow",
         lambda setup: GpuWorkloadCollector(setup.gpus, setup.root, setup.workload),
         refresh="workload", needs_gpu=True,
         help="which workload uses each GPU: kubelet, Slurm job folder, the GPU's processes")
