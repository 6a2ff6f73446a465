"""gpunet_gpu_workload_info: which workload uses each GPU.

Kubernetes through a real gRPC PodResources server on a Unix socket (the kubelet's API,
served by the generated servicer), Slurm through a real job-mapping folder and fixture
process trees (proc/<pid>/cgroup, environ, comm) behind NVML's compute processes. Every
expectation is written from what the test served or wrote, not from the exporter's code.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from concurrent import futures

import grpc
import pytest
from exporter_harness import Node
from procs import http_get, start_exporter

from exporter.cli import make_sampler
from exporter.collectors.gpu_workload import pod_workload
from exporter.readers.podresources import api_pb2, api_pb2_grpc
from exporter.registry import Registry
from exporter.settings import parse_args
from exporter.workload_options import DEFAULT_POD_PATTERN, WorkloadOptions, compile_pod_pattern

INFO = "gpunet_gpu_workload_info"
FIELDS = ("gpu", "workload", "source", "namespace", "pod", "container")


# --- a real PodResources server ---------------------------------------------------------------

class Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: list[dict]):
        self.pods = pods
        self.delay = 0.0
        self.calls = 0

    def List(self, request, context):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        return api_pb2.ListPodResourcesResponse(pod_resources=[
            api_pb2.PodResources(name=p["name"], namespace=p["namespace"], containers=[
                api_pb2.ContainerResources(name=c["name"], devices=[
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
                    for resource, ids in c["devices"].items()])
                for c in p["containers"]])
            for p in self.pods])


class Kubelet:
    """grpc.server on a Unix socket in a short temporary folder (sun_path holds 107 bytes)."""

    def __init__(self, servicer=None, handler=None):
        self.lister = servicer  # to count calls and change the pods between ticks
        self.dir = tempfile.mkdtemp(prefix="gpunet-kubelet-")
        self.socket = os.path.join(self.dir, "kubelet.sock")
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        if servicer is not None:
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, self.server)
        if handler is not None:
            self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def kubelet():
    started = []

    def start(pods=None, handler=None):
        k = Kubelet(Lister(pods) if pods is not None else None, handler)
        started.append(k)
        return k

    yield start
    for k in started:
        k.stop()


def pod(namespace, name, container, **devices):
    return {"namespace": namespace, "name": name,
            "containers": [{"name": container, "devices": {k.replace("__", "/").replace("_", "."): v
                                                           for k, v in devices.items()}}]}


def gpu_pod(namespace, name, container, *ids, resource="nvidia.com/gpu"):
    return {"namespace": namespace, "name": name, "containers": [{"name": container, "devices": {resource: list(ids)}}]}


# --- helpers ---------------------------------------------------------------------------------

def copy_node(node_copy, name):
    node_copy("roce-mlx5")  # the GPU nodes link to its network
    return node_copy(name)


def uuids(root) -> list[str]:
    return [g["uuid"] for g in sorted(json.loads((root / "nvml.json").read_text())["gpus"], key=lambda g: g["index"])]


def rows(node) -> set[tuple[str, ...]]:
    return {tuple(dict(labels)[f] for f in FIELDS) for labels in node.series(INFO)}


def up(node) -> float | None:
    return node.value("gpunet_exporter_collector_up", collector="gpu_workload")


def problems(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if "gpu_workload" in r.getMessage())


def options(**kw) -> WorkloadOptions:
    return WorkloadOptions(**{"interval": 0.0, **kw})


# The rows h100-jobs yields from its mapping folder and process trees (tests/fixtures/nodes/README.md).
H100_JOBS = {
    ("0", "4711", "slurm", "", "", ""), ("1", "4711", "slurm", "", "", ""),  # mapping folder, by UUID
    ("2", "4711", "slurm", "", "", ""), ("3", "4711", "slurm", "", "", ""),  # ... and by index
    ("4", "4712", "slurm", "", "", ""),  # cgroup v1 /slurm/uid_1000/job_4712/...
    ("5", "4713", "slurm", "", "", ""),  # no job in the cgroup: SLURM_JOB_ID in environ
    ("6", "7c9e2d4a-1b3f-4e5a-9c8d-0f1e2d3c4b5a", "kubernetes", "", "", ""),  # kubepods cgroup: the pod UID
    ("7", "all_reduce_perf", "process", "", "", ""),  # nothing but its command name
    ("7", "llm-sft-42", "torchelastic", "", "", ""),  # TORCHELASTIC_RUN_ID; pid 5402 has exited
}


# --- Kubernetes ------------------------------------------------------------------------------

def test_pods_served_by_the_kubelet_api_name_the_gpus_workloads(node_copy, kubelet):
    root = copy_node(node_copy, "h100-8gpu")
    u = uuids(root)
    k = kubelet([
        pod("team-a", "llama-master-0", "pytorch", nvidia_com__gpu=[u[0], u[1]], rdma__hca_shared=["hca0"]),
        pod("team-a", "llama-worker-0", "pytorch", nvidia_com__gpu=[u[2], u[3]]),
        pod("team-a", "llama-launcher-x7k2p", "launcher"),  # an MPIJob launcher holds no GPU
        pod("team-b", "llama-worker-0", "pytorch", nvidia_com__gpu=[u[4]]),  # same name, other namespace
        gpu_pod("infer", "web-7d4b9c8f6d-x2k9p", "server", u[5] + "::0"),  # time-sliced replicas of GPU 5
        gpu_pod("infer", "web-7d4b9c8f6d-bq7nm", "server", u[5] + "::1"),
    ])
    node = Node(root, workload=options(kubelet_socket=k.socket)).tick()
    assert rows(node) == {
        ("0", "team-a/llama", "kubernetes", "team-a", "llama-master-0", "pytorch"),
        ("1", "team-a/llama", "kubernetes", "team-a", "llama-master-0", "pytorch"),
        ("2", "team-a/llama", "kubernetes", "team-a", "llama-worker-0", "pytorch"),
        ("3", "team-a/llama", "kubernetes", "team-a", "llama-worker-0", "pytorch"),
        ("4", "team-b/llama", "kubernetes", "team-b", "llama-worker-0", "pytorch"),
        ("5", "infer/web", "kubernetes", "infer", "web-7d4b9c8f6d-x2k9p", "server"),
        ("5", "infer/web", "kubernetes", "infer", "web-7d4b9c8f6d-bq7nm", "server"),
    }
    assert up(node) == 1.0
    # Only the info series carries these labels.
    assert not any("workload" in dict(labels) for (name, labels) in node.values() if name != INFO)


def test_mig_devices_map_to_their_gpu(node_copy, kubelet):
    root = copy_node(node_copy, "h100-8gpu")
    doc = json.loads((root / "nvml.json").read_text())
    doc["gpus"][3]["mig_uuids"] = ["MIG-1b2c3d4e-0000-5aaa-8bbb-000000000001", "MIG-1b2c3d4e-0000-5aaa-8bbb-000000000002"]
    (root / "nvml.json").write_text(json.dumps(doc))
    k = kubelet([gpu_pod("ml", "notebook-0", "jupyter", "MIG-1b2c3d4e-0000-5aaa-8bbb-000000000002",
                         resource="nvidia.com/mig-1g.10gb")])
    node = Node(root, workload=options(kubelet_socket=k.socket)).tick()
    assert rows(node) == {("3", "ml/notebook", "kubernetes", "ml", "notebook-0", "jupyter")}


def test_the_kubelet_is_asked_at_most_once_per_interval(node_copy, kubelet):
    root = copy_node(node_copy, "h100-8gpu")
    u = uuids(root)
    k = kubelet([gpu_pod("a", "job-1-worker-0", "c", u[0])])
    node = Node(root, workload=WorkloadOptions(kubelet_socket=k.socket, interval=10.0))
    node.tick(now=100.0)
    assert k.lister.calls == 1
    k.lister.pods = [gpu_pod("a", "job-2-worker-0", "c", u[1])]
    node.tick(now=101.0).tick(now=109.5)
    assert k.lister.calls == 1  # served from the last answer
    assert rows(node) == {("0", "a/job-1", "kubernetes", "a", "job-1-worker-0", "c")}
    node.tick(now=110.0)
    assert k.lister.calls == 2
    assert rows(node) == {("1", "a/job-2", "kubernetes", "a", "job-2-worker-0", "c")}


def test_a_slow_kubelet_is_an_error_naming_its_socket_and_costs_only_its_rows(node_copy, kubelet, caplog):
    root = copy_node(node_copy, "h100-jobs")
    u = uuids(root)
    k = kubelet([gpu_pod("a", "x-0", "c", u[0])])
    k.lister.delay = 3.0
    node = Node(root, workload=options(kubelet_socket=k.socket, kubelet_timeout=0.3))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        node.tick()
    assert time.monotonic() - started < 2.0
    assert up(node) == 0.0
    assert k.socket in problems(caplog) and "DEADLINE_EXCEEDED" in problems(caplog)
    assert rows(node) == H100_JOBS  # the other sources still attribute every GPU
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="0") is not None  # and other series are served


def test_a_kubelet_answering_garbage_is_an_error_naming_its_socket(node_copy, kubelet, caplog):
    root = copy_node(node_copy, "h100-jobs")
    garbage = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(lambda request, context: b"\xff\xff\xff\xff not protobuf")})
    k = kubelet(handler=garbage)
    node = Node(root, workload=options(kubelet_socket=k.socket))
    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        node.tick()
    assert up(node) == 0.0
    assert f"kubelet PodResources {k.socket}: List failed" in problems(caplog)
    assert rows(node) == H100_JOBS


def test_a_configured_socket_that_is_absent_is_an_error_an_unconfigured_one_is_off(node_copy, caplog):
    root = copy_node(node_copy, "h100-jobs")
    missing = str(root / "nowhere" / "kubelet.sock")
    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        node = Node(root, workload=options(kubelet_socket=missing)).tick()
    assert up(node) == 0.0 and missing in problems(caplog)
    assert rows(node) == H100_JOBS
    quiet = Node(root, workload=options()).tick()  # default socket, absent under this root
    assert up(quiet) == 1.0 and rows(quiet) == H100_JOBS


def test_a_device_that_is_no_gpu_here_is_an_error_naming_the_pod(node_copy, kubelet, caplog):
    root = copy_node(node_copy, "h100-8gpu")
    u = uuids(root)
    k = kubelet([gpu_pod("a", "stray-0", "c", "GPU-00000000-dead-beef-0000-000000000000"),
                 gpu_pod("a", "good-0", "c", u[7])])
    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        node = Node(root, workload=options(kubelet_socket=k.socket)).tick()
    assert "pod a/stray-0 container c" in problems(caplog)
    assert "GPU-00000000-dead-beef-0000-000000000000" in problems(caplog)
    assert rows(node) == {("7", "a/good", "kubernetes", "a", "good-0", "c")}


def test_kubernetes_wins_over_the_slurm_folder_which_wins_over_processes(node_copy, kubelet):
    root = copy_node(node_copy, "h100-jobs")
    u = uuids(root)
    k = kubelet([gpu_pod("ns", "trainer-0", "main", u[0], u[7])])
    (root / "run/gpunet/slurm-jobs/9000").write_text("gpus=4\n")  # GPU 4's process says job 4712
    node = Node(root, workload=options(kubelet_socket=k.socket)).tick()
    expected = {r for r in H100_JOBS if r[0] not in ("0", "4", "7")}
    expected |= {("0", "ns/trainer", "kubernetes", "ns", "trainer-0", "main"),
                 ("7", "ns/trainer", "kubernetes", "ns", "trainer-0", "main"),
                 ("4", "9000", "slurm", "", "", "")}
    assert rows(node) == expected


def test_the_exporter_process_serves_the_kubelets_pods(node_copy, kubelet, tmp_path):
    """The real daemon, its socket given by the environment variable."""
    root = copy_node(node_copy, "h100-8gpu")
    u = uuids(root)
    k = kubelet([gpu_pod("team-a", "llama-worker-3", "pytorch", u[6])])
    os.environ["GPUNET_WORKLOAD_KUBELET_SOCKET"] = k.socket
    try:
        proc, url = start_exporter(tmp_path, "--root", str(root))
    finally:
        del os.environ["GPUNET_WORKLOAD_KUBELET_SOCKET"]
    try:
        status, _, body = http_get(url + "/metrics")
        assert status == 200
        assert _has_series(body.decode(), gpu="6", workload="team-a/llama", source="kubernetes",
                           namespace="team-a", pod="llama-worker-3", container="pytorch")
    finally:
        proc.stop()


def _has_series(text, **labels):
    from prometheus_client.parser import text_string_to_metric_families

    return any(s.name == INFO and all(s.labels.get(k) == v for k, v in labels.items())
               for f in text_string_to_metric_families(text) for s in f.samples)


# --- Slurm -----------------------------------------------------------------------------------

def test_the_fixture_processes_and_folder_tell_each_gpus_job():
    from conftest import FIXTURES

    node = Node(FIXTURES / "h100-jobs", workload=options()).tick()
    assert rows(node) == H100_JOBS
    assert up(node) == 1.0


def test_without_the_folder_the_cgroup_still_names_the_job(node_copy):
    root = copy_node(node_copy, "h100-jobs")
    shutil.rmtree(root / "run")
    node = Node(root, workload=options()).tick()
    assert rows(node) == H100_JOBS  # GPUs 0-3: their processes' cgroup v2 job_4711
    (root / "proc/4102/cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
    (root / "proc/4102/environ").write_bytes(b"PATH=/usr/bin\0")
    node.tick()
    assert ("2", "python3", "process", "", "", "") in rows(node)  # no job anywhere: the command name


def test_a_malformed_job_file_is_an_error_naming_its_line_and_the_other_jobs_stay(node_copy, caplog):
    root = copy_node(node_copy, "h100-8gpu")
    jobs = root / "run/gpunet/slurm-jobs"
    jobs.mkdir(parents=True)
    (jobs / "100").write_text("gpus=0,1\nname=good\n")
    (jobs / "101").write_text("# a comment\ngpus=2\nthis line is wrong\n")
    (jobs / "102").write_text("gpus=3,banana\n")
    (jobs / "103").write_text("gpus=9\n")  # the node has GPUs 0-7
    (jobs / "104").write_text("name=no-gpus\n")
    (jobs / "106").write_text("gpus=6\ngpus=7\n")
    (jobs / "not-a-job").write_text("gpus=4\n")
    (jobs / ".105.tmp").write_text("gpus=5\n")  # a prolog's file being written: ignored
    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        node = Node(root, workload=options()).tick()
    log = problems(caplog)
    assert f"{jobs / '101'}:3: expected key=value" in log
    assert f"{jobs / '102'}:1: gpus: 'banana'" in log
    assert f"{jobs / '103'}:1: gpus: '9' is no GPU" in log
    assert f"{jobs / '104'}: no gpus= line" in log
    assert f"{jobs / 'not-a-job'}: not a Slurm job id" in log
    assert f"{jobs / '106'}:2: a second gpus= line (the first is {jobs / '106'}:1)" in log
    assert ".105.tmp" not in log
    assert up(node) == 0.0
    assert node.value("gpunet_exporter_collector_errors_total", collector="gpu_workload") == 6
    assert rows(node) == {("0", "100", "slurm", "", "", ""), ("1", "100", "slurm", "", "", "")}


def test_a_job_that_ends_loses_its_series(node_copy):
    root = copy_node(node_copy, "h100-8gpu")
    jobs = root / "run/gpunet/slurm-jobs"
    jobs.mkdir(parents=True)
    (jobs / "200").write_text("gpus=6,7\n")
    (jobs / "201").write_text("gpus=0\n")
    node = Node(root, workload=WorkloadOptions(interval=10.0)).tick(now=0.0)
    assert rows(node) == {("6", "200", "slurm", "", "", ""), ("7", "200", "slurm", "", "", ""),
                          ("0", "201", "slurm", "", "", "")}
    (jobs / "200").unlink()  # the epilog
    node.tick(now=10.0)
    assert rows(node) == {("0", "201", "slurm", "", "", "")}


def test_a_job_whose_processes_exit_loses_its_series(node_copy):
    root = copy_node(node_copy, "h100-jobs")
    node = Node(root, workload=options()).tick()
    doc = json.loads((root / "nvml.json").read_text())
    doc["gpus"][4]["processes"] = []
    (root / "nvml.json").write_text(json.dumps(doc))
    node.tick()
    assert rows(node) == {r for r in H100_JOBS if r[0] != "4"}


def test_a_bad_processes_entry_is_an_error_naming_the_gpu_and_costs_only_it(node_copy, caplog):
    root = copy_node(node_copy, "h100-jobs")
    doc = json.loads((root / "nvml.json").read_text())
    doc["gpus"][5]["processes"] = [{"pid": "five"}]
    (root / "nvml.json").write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        node = Node(root, workload=options()).tick()
    assert "nvml.json gpu 5 processes[0]" in problems(caplog)
    assert rows(node) == {r for r in H100_JOBS if r[0] != "5"}


# --- naming and settings -----------------------------------------------------------------------

@pytest.mark.parametrize("pod_name, job", [
    ("llama-worker-3", "llama"), ("llama-master-0", "llama"),  # PyTorchJob
    ("llama-launcher-x7k2p", "llama"),  # MPIJob launcher (a Job's pod: 5 random characters)
    ("web-7d4b9c8f6d-x2k9p", "web"),  # Deployment: ReplicaSet hash + random suffix
    ("train-0", "train"),  # StatefulSet ordinal
    ("llama-2-7b-worker-0", "llama-2-7b"), ("gpt-neox-20b-worker-12", "gpt-neox-20b"),
    ("my-model-train", "my-model-train"),  # 'train' has vowels: no random suffix
    ("solo", "solo"),
])
def test_the_default_pod_pattern_names_the_job(pod_name, job):
    assert pod_workload(compile_pod_pattern(DEFAULT_POD_PATTERN), pod_name) == job


def test_settings_reach_the_collector_from_flags_environment_and_config(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUNET_WORKLOAD_KUBELET_SOCKET", "/run/k.sock")
    config = tmp_path / "gpunet.yml"
    config.write_text("workload.slurm-dir: /run/jobs\nworkload.interval: 30\n")
    args = parse_args(["--config", str(config), "--workload.pod-pattern", r"^(?P<workload>[a-z]+)"])
    assert (args.workload_kubelet_socket, args.workload_slurm_dir, args.workload_interval) == \
        ("/run/k.sock", "/run/jobs", 30.0)
    sampler = make_sampler(parse_args(["--root", str(tmp_path), "--gpu-fixture", "tests/fixtures/nodes/h100-8gpu/"
                                       "nvml.json", "--workload.interval", "5"]), Registry())
    (collector,) = [c for c in sampler.slow if c.name == "gpu_workload"]
    assert collector.interval == 5.0
    with pytest.raises(SystemExit):
        parse_args(["--workload.pod-pattern", "(no-group)"])


def test_a_snapshot_keeps_the_workloads_and_no_other_environment(tmp_path):
    import subprocess

    from conftest import FIXTURES
    from procs import REPO, exporter_command

    out = tmp_path / "snap"
    result = subprocess.run(exporter_command("--root", str(FIXTURES / "h100-jobs"), "snapshot", str(out)), cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert rows(Node(out, workload=options()).tick()) == H100_JOBS
    assert (out / "proc/5200/environ").read_bytes() == b"SLURM_JOB_ID=4713\0SLURM_JOB_NAME=eval\0"  # no PATH, HOME
    assert (out / "run/gpunet/slurm-jobs/4711").read_text() == \
        (FIXTURES / "h100-jobs/run/gpunet/slurm-jobs/4711").read_text()


def test_the_slurm_prolog_writes_what_the_exporter_reads_and_the_epilog_removes_it(node_copy, tmp_path):
    import subprocess

    from procs import REPO

    root = copy_node(node_copy, "h100-8gpu")
    jobs = tmp_path / "slurm-jobs"
    env = {"PATH": os.environ["PATH"], "GPUNET_SLURM_DIR": str(jobs), "SLURM_JOB_ID": "31337",
           "SLURM_JOB_GPUS": "4,5", "SLURM_JOB_NAME": "eval # nightly\ngpus=7", "SLURM_JOB_USER": "ada"}
    prolog = subprocess.run(["sh", str(REPO / "deploy/slurm/prolog.sh")], env=env, capture_output=True, timeout=10)
    assert (prolog.returncode, prolog.stderr) == (0, b"")
    node = Node(root, workload=options(slurm_dir=str(jobs))).tick()
    assert rows(node) == {("4", "31337", "slurm", "", "", ""), ("5", "31337", "slurm", "", "", "")}
    assert up(node) == 1.0
    no_gpus = subprocess.run(["sh", str(REPO / "deploy/slurm/prolog.sh")],
                             env={**env, "SLURM_JOB_ID": "31338", "SLURM_JOB_GPUS": ""}, timeout=10)
    assert no_gpus.returncode == 0 and not (jobs / "31338").exists()  # a CPU-only job: nothing to say
    epilog = subprocess.run(["sh", str(REPO / "deploy/slurm/epilog.sh")], env=env, capture_output=True, timeout=10)
    assert (epilog.returncode, epilog.stderr) == (0, b"")
    assert rows(node.tick()) == set()
    unwritable = subprocess.run(["sh", str(REPO / "deploy/slurm/prolog.sh")],
                                env={**env, "GPUNET_SLURM_DIR": "/proc/gpunet-cannot-exist"}, timeout=10)
    assert unwritable.returncode == 0  # a failing prolog would drain the node


# --- the documented PromQL joins, in a real Prometheus ------------------------------------------

def _promql(url: str, expr: str, at: float) -> dict:
    import urllib.parse

    status, _, body = http_get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": at}))
    return json.loads(body)


def _doc_queries() -> list[str]:
    import re

    from procs import REPO

    return re.findall(r"```promql\n(.*?)```", (REPO / "docs/deploy.md").read_text(), re.S)


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_the_documented_joins_give_idle_time_per_workload(tmp_path, served):
    t0, step, n = 1767225600, 15, 41
    idle = {("node-a:9845", "0", "quiet"): 0.3, ("node-a:9845", "0", "paused"): 0.2,
            ("node-a:9845", "1", "quiet"): 0.25, ("node-a:9845", "2", "quiet"): 0.1,
            ("node-b:9845", "0", "paused"): 0.4}  # idle seconds per second
    info = [("node-a:9845", "0", "team-a/llama", "llama-worker-0"), ("node-a:9845", "0", "team-a/llama", "llama-worker-1"),
            ("node-a:9845", "1", "team-a/llama", "llama-worker-1"), ("node-a:9845", "2", "4711", ""),
            ("node-a:9845", "2", "9999", ""), ("node-b:9845", "0", "team-a/llama", "llama-master-0")]
    lines = ["# TYPE gpunet_gpu_idle_seconds counter"]
    for (instance, gpu, state), rate in idle.items():
        lines += [f'gpunet_gpu_idle_seconds_total{{gpu="{gpu}",instance="{instance}",job="gpunet",'
                  f'network_state="{state}"}} {rate * i * step} {t0 + i * step}' for i in range(n)]
    lines.append("# TYPE gpunet_gpu_workload_info gauge")
    for instance, gpu, workload, pod_name in info:
        source = "kubernetes" if pod_name else "slurm"
        lines += [f'gpunet_gpu_workload_info{{container="",gpu="{gpu}",instance="{instance}",job="gpunet",'
                  f'namespace="{"team-a" if pod_name else ""}",pod="{pod_name}",source="{source}",'
                  f'workload="{workload}"}} 1 {t0 + i * step}' for i in range(n)]
    trace = tmp_path / "jobs.om"
    trace.write_text("\n".join(lines) + "\n# EOF\n")
    url = served(trace)
    at = t0 + (n - 1) * step
    per_workload, split = _doc_queries()[:2]
    result = _promql(url, per_workload, at)
    got = {r["metric"]["workload"]: float(r["value"][1]) for r in result["data"]["result"]}
    assert got == pytest.approx({"team-a/llama": 0.5 + 0.25 + 0.4, "4711": 0.1, "9999": 0.1})
    # The split by network_state refuses a GPU that two workloads share (node-a GPU 2) ...
    refused = _promql(url, split, at)
    assert refused["status"] == "error" and "many-to-many" in refused["error"]
    # ... and answers once that GPU is left out.
    answer = _promql(url, split.replace("(gpunet_gpu_workload_info)", '(gpunet_gpu_workload_info{gpu!="2"})'), at)
    got = {(r["metric"]["workload"], r["metric"]["network_state"]): float(r["value"][1])
           for r in answer["data"]["result"]}
    assert got == pytest.approx({("team-a/llama", "quiet"): 0.3 + 0.25, ("team-a/llama", "paused"): 0.2 + 0.4})
    shared = _promql(url, "count by (instance, gpu) (count by (instance, gpu, workload) "
                          "(gpunet_gpu_workload_info)) > 1", at)
    assert [(r["metric"]["instance"], r["metric"]["gpu"]) for r in shared["data"]["result"]] == [("node-a:9845", "2")]


def test_live_processes_are_told_apart_by_their_real_proc_files():
    """The reader on this machine's /proc: real processes started with a Slurm job's or
    torchrun's environment, and one with neither."""
    import subprocess
    import sys

    from exporter.readers.processes import Owner, owner
    from exporter.root import Root

    live = Root("/")
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    base = {"PATH": os.environ["PATH"]}
    procs = {name: subprocess.Popen(sleeper, env={**base, **env}) for name, env in (
        ("slurm", {"SLURM_JOB_ID": "424242", "SLURM_JOB_NAME": "x"}),
        ("torchrun", {"TORCHELASTIC_RUN_ID": "run-77"}),
        ("plain", {}))}
    try:
        cgroup = live.read_text(f"proc/{procs['plain'].pid}/cgroup")
        if "slurm" in cgroup or "kubepods" in cgroup:
            pytest.skip(f"this test runs inside a job's cgroup: {cgroup.strip()}")
        comm = live.read_text(f"proc/{procs['plain'].pid}/comm").strip()
        assert owner(live, procs["slurm"].pid) == Owner("slurm", "424242")
        assert owner(live, procs["torchrun"].pid) == Owner("torchelastic", "run-77")
        assert owner(live, procs["plain"].pid) == Owner("process", comm)
        assert comm.startswith("python")
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert owner(live, procs["plain"].pid) is None  # gone (reaped): no files, no row


def test_a_kubelet_restart_costs_one_read_and_is_reached_again_at_once(node_copy, caplog):
    root = copy_node(node_copy, "h100-8gpu")
    u = uuids(root)
    first = Kubelet(Lister([gpu_pod("a", "job-0", "c", u[0])]))
    try:
        node = Node(root, workload=options(kubelet_socket=first.socket)).tick()
        assert rows(node) == {("0", "a/job", "kubernetes", "a", "job-0", "c")}
        first.server.stop(0)
        import socket

        if os.path.exists(first.socket):
            os.unlink(first.socket)
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(first.socket)  # the socket file of a kubelet that is down: bound, refusing
        with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
            node.tick()
        stale.close()
        assert up(node) == 0.0 and rows(node) == set()
        assert f"kubelet PodResources {first.socket}: List failed: UNAVAILABLE" in problems(caplog)
        # The kubelet comes back on the same socket: the next read reaches it, without waiting
        # out gRPC's reconnect backoff.
        again = grpc.server(futures.ThreadPoolExecutor(2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(Lister([gpu_pod("a", "job-1", "c", u[1])]), again)
        if os.path.exists(first.socket):
            os.unlink(first.socket)
        again.add_insecure_port(f"unix://{first.socket}")
        again.start()
        try:
            started = time.monotonic()
            node.tick()
            assert time.monotonic() - started < 1.0
            assert up(node) == 1.0 and rows(node) == {("1", "a/job", "kubernetes", "a", "job-1", "c")}
        finally:
            again.stop(0)
    finally:
        first.stop()
