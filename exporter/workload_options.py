"""Where the exporter learns which workload holds each GPU, and how a pod name becomes a job
name: the --workload.* settings, read by the gpu_workload collector."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Pod name -> job name: the regex's group "workload" (the whole name when it does not match).
# It strips, from the right and each at most once: a random Job/ReplicaSet pod suffix (5
# characters of Kubernetes' name alphabet, which has no vowels), a ReplicaSet hash (6-10 of
# them), an ordinal (StatefulSet, indexed Job, worker-3), and a trainer role (worker, master,
# launcher, ...). llama-worker-3, llama-master-0, llama-launcher-x7k2p -> llama;
# web-7d4b9c8f6d-x2k9p -> web; train-0 -> train.
_ALPHABET = "[bcdfghjklmnpqrstvwxz2456789]"
ROLES = ("worker", "master", "launcher", "chief", "ps", "evaluator", "driver", "executor", "head", "leader",
         "scheduler", "server")
DEFAULT_POD_PATTERN = (rf"^(?P<workload>.+?)(?:-(?:{'|'.join(ROLES)}))?(?:-[0-9]+)?(?:-{_ALPHABET}{{6,10}})?"
                       rf"(?:-{_ALPHABET}{{5}})?$")


def compile_pod_pattern(text: str) -> re.Pattern:
    """The --workload.pod-pattern regex; ValueError when it is no regex or has no group 'workload'."""
    try:
        pattern = re.compile(text)
    except re.error as e:
        raise ValueError(f"not a regular expression: {e}") from None
    if "workload" not in pattern.groupindex:
        raise ValueError("needs a named group (?P<workload>...)")
    return pattern



@dataclass(frozen=True)
class WorkloadOptions:
    kubelet_socket: str | None = None  # None: DEFAULT_SOCKET under the root, off when absent
    slurm_dir: str | None = None  # None: DEFAULT_DIR under the root, off when absent
    interval: float = 10.0
    pod_pattern: str = DEFAULT_POD_PATTERN
    kubelet_timeout: float = 1.0
