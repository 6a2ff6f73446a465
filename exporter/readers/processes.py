"""Which job a process belongs to, from its ``proc/<pid>/`` files (read through the Root,
so a fixture folder stands in for /proc).

First match wins:
1. ``cgroup`` under Slurm's hierarchy (cgroup v2 ``.../slurmstepd.scope/job_<id>/step_<n>/...``,
   v1 ``.../slurm/uid_<u>/job_<id>/...``): source slurm, workload the job id;
2. ``environ`` with ``SLURM_JOB_ID`` (a job whose cgroup plugin is off): source slurm;
3. ``cgroup`` under ``kubepods`` (``pod<uid>``, systemd or cgroupfs driver): source
   kubernetes, workload the pod UID (the kubelet, when reachable, names the pod instead;
   kube-state-metrics' ``kube_pod_info{uid}`` names it too);
4. ``environ`` with ``TORCHELASTIC_RUN_ID`` (torchrun's rendezvous id, the same on every
   node of the run; ``none`` is torchrun's default and says nothing): source process;
5. otherwise ``comm``, the command name: source process, so on-call still sees what runs.

A process that has exited meanwhile has no files and is skipped; an ``environ`` the
exporter may not read (another user's, without root) counts as empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.root import Root, SourceError

ENV_KEYS = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID")  # all a snapshot keeps of environ
FILES = ("cgroup", "comm")
SLURM_CGROUP = re.compile(r"slurm.*/job_([0-9]+)(?:/|$)")
KUBE_CGROUP = re.compile(r"kubepods.*pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True)
class Owner:
    # slurm | kubernetes | torchelastic: a job's name, the same on all its nodes (kubernetes
    # here is a pod UID, one per node); process: only the command name, shared by any job.
    source: str
    workload: str


def owner(root: Root, pid: int) -> Owner | None:
    """The job of a process, None when the process is gone."""
    cgroup = _read(root, f"proc/{pid}/cgroup")
    comm = _read(root, f"proc/{pid}/comm")
    if cgroup is None and comm is None:
        return None
    cgroup = cgroup or ""
    m = SLURM_CGROUP.search(cgroup)
    if m:
        return Owner("slurm", m.group(1))
    env = environ(root, pid)
    if env.get("SLURM_JOB_ID", "").strip():
        return Owner("slurm", env["SLURM_JOB_ID"].strip())
    m = KUBE_CGROUP.search(cgroup)
    if m:
        return Owner("kubernetes", m.group(1).replace("_", "-"))
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        return Owner("torchelastic", run_id)
    return Owner("process", (comm or "").strip() or str(pid))


def environ(root: Root, pid: int) -> dict[str, str]:
    text = _read(root, f"proc/{pid}/environ") or ""
    out = {}
    for entry in text.split("\0"):
        key, sep, value = entry.partition("=")
        if sep:
            out[key] = value
    return out


def _read(root: Root, rel: str) -> str | None:
    try:
        return root.read_text(rel)
    except SourceError:
        return None
