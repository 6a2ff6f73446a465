"""Which Slurm job holds which GPU: the job-mapping folder a Slurm prolog writes.

One file per running job, named after the job id (``SLURM_JOB_ID``), removed by the
epilog (deploy/slurm/ has both scripts). Lines are ``key=value``; ``#`` starts a comment:

    gpus=0,1,2,3
    name=llama-pretrain

``gpus`` (required) lists the job's GPUs on this node, comma-separated, as NVML indices
(what ``nvidia-smi`` numbers and Slurm's ``SLURM_JOB_GPUS`` holds with gres AutoDetect=nvml)
or GPU / MIG UUIDs (``GPU-...``, ``MIG-...``), which are right whatever gres.conf numbers.
Other keys (``name``, ``user``) are for people reading the folder and are not exported.
Names starting with ``.`` are ignored, so a prolog can write ``.<id>.tmp`` and rename it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.root import Root, SourceError

DEFAULT_DIR = "run/gpunet/slurm-jobs"  # under --root
JOB_ID = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    gpus: tuple[str, ...]  # as written: NVML indices or UUIDs
    where: str  # file:line of the gpus line, for errors about its values


def jobs_folder(root: Root, configured: str | None) -> Root:
    """The folder to read: the one configured (a path on this machine), else DEFAULT_DIR under the root."""
    return Root(configured or root.path(DEFAULT_DIR))


def read_jobs(folder: Root, errors: list[SourceError]) -> list[SlurmJob]:
    """The jobs in the folder; a malformed file is one error (naming the file and line)
    and costs only its own job."""
    jobs = []
    for name in folder.listdir(""):
        if name.startswith("."):
            continue
        path = str(folder.path(name))
        if not JOB_ID.match(name):
            errors.append(SourceError(path, "not a Slurm job id: name the file after SLURM_JOB_ID"))
            continue
        try:
            text = folder.read_text(name)
        except SourceError as e:
            if e.what == "No such file or directory":  # the epilog removed it meanwhile
                continue
            errors.append(e)
            continue
        try:
            jobs.append(parse_job(name, text, path))
        except SourceError as e:
            # Without its traceback, which holds the parse's frame and so the whole text (up to
            # MAX_READ a file) for as long as the list of errors lives.
            errors.append(e.with_traceback(None))
    return jobs


def parse_job(job_id: str, text: str, path: str) -> SlurmJob:
    gpus: tuple[str, ...] | None = None
    where = path
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise SourceError(f"{path}:{number}", f"expected key=value, got {raw.strip()[:80]!r}")
        if key.strip() == "gpus":
            if gpus is not None:
                raise SourceError(f"{path}:{number}", f"a second gpus= line (the first is {where})")
            tokens = tuple(t.strip() for t in value.split(",") if t.strip())
            bad = [t for t in tokens if not (t.isdigit() or t.startswith(("GPU-", "MIG-")))]
            if bad:
                raise SourceError(f"{path}:{number}",
                                  f"gpus: {bad[0]!r} is neither an NVML index nor a GPU-/MIG- UUID")
            gpus, where = tokens, f"{path}:{number}"
    if gpus is None:
        raise SourceError(path, "no gpus= line")
    return SlurmJob(job_id, gpus, where)
