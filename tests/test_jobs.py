"""Job-aware diagnosis: one diagnosis per job, peer comparison inside a job only.

Ground truth is what the traces were generated with (labels.json: each job's instances,
each incident's job, class and culprits), never what the diagnoser said before."""

import json
import shutil

import pytest
from procs import REPO
from test_diagnoser import diagnose

from diagnoser.evaluate import labels_of

MULTI = sorted(t for t in (REPO / "replay_data").glob("jobs*.om.gz"))


def run_json(*args: str) -> dict:
    result = diagnose(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_per_job(doc: dict, labels: dict, attributed: bool) -> None:
    """Every job found with exactly its nodes; every incident under its job with its class and
    culprits; nothing else found (the other jobs are healthy)."""
    truth_jobs = {j["name"]: sorted(j["nodes"]) for j in labels["jobs"]}
    found = {j["name"]: sorted(j["instances"]) for j in doc["jobs"]}
    if attributed:
        assert found == truth_jobs
    else:
        assert sorted(found.values()) == sorted(truth_jobs.values())
        assert all(name.startswith("unattributed") for name in found)
    group_of = {}
    for name, nodes in found.items():
        for n in nodes:
            group_of[n] = name
    used = set()
    for incident in labels["incidents"]:
        # the group holding the labelled job's nodes
        job = incident["job"] if attributed else group_of[truth_jobs[incident["job"]][0]]
        hits = [k for k, f in enumerate(doc["findings"])
                if f["job"] == job and f["class"] == incident["class"] and set(incident["nodes"]) <= set(f["nodes"])
                and min(f["end"], incident["end"]) - max(f["start"], incident["start"]) >=
                0.5 * (incident["end"] - incident["start"])]
        assert hits, (incident, doc["findings"])
        used.update(hits)
    extra = [f for k, f in enumerate(doc["findings"]) if k not in used]
    assert not extra, extra
    # On a shared fabric: the victim job is told which job's fault it waited on, and the
    # cause names the victim; the victim has no finding of its own (its pauses are the cause's).
    for waited in labels.get("waited_on", []):
        victim = next(j for j in doc["jobs"] if j["name"] == waited["job"])
        assert victim["findings"] == 0 and victim["verdict"] == "findings", victim
        assert [(w["job"], w["class"], w["nodes"]) for w in victim.get("waited_on", [])] == \
            [(waited["cause_job"], waited["class"], waited["nodes"])], victim
        cause = next(f for f in doc["findings"] if f["job"] == waited["cause_job"] and f["class"] == waited["class"])
        assert [v["job"] for v in cause["victims"]] == [waited["job"]]
    # docs/diagnose.md keys stay, with a job on each finding
    assert {"source", "start", "end", "nodes", "gpus", "gpu_idle_fraction", "findings"} <= doc.keys()
    assert doc["nodes"] == sum(len(v) for v in truth_jobs.values())
    for j in doc["jobs"]:
        assert j["nodes"] == len(j["instances"]) and j["gpus"] > 0 and 0 <= j["gpu_idle_fraction"] <= 1


@pytest.mark.parametrize("trace", MULTI, ids=[t.name for t in MULTI])
def test_multi_job_trace_is_diagnosed_per_job(trace):
    labels = labels_of(trace)
    assert_per_job(run_json("--replay", str(trace)), labels, "no_workload_info" not in trace.name)


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
@pytest.mark.parametrize("trace", MULTI, ids=[t.name for t in MULTI])
def test_multi_job_trace_from_prometheus(trace, served):
    from test_diagnoser_prometheus import window

    start, end = window(trace)
    doc = run_json("--prometheus", served(trace), "--start", start, "--end", end)
    assert_per_job(doc, labels_of(trace), "no_workload_info" not in trace.name)


# Held out: seeds, sizes, scrape intervals and hostnames the grouping was not tuned on.
HELD_OUT = [
    ("611", "15s", "ip", ["train-x: --nodes 14 --gpus 8 --nics 4 --fault gpu_throttle:start=18m,dur=8m",
                          "train-y: --nodes 7 --gpus 8 --nics 4"]),
    ("612", "30s", "dgx", ["p: --nodes 5 --gpus 4 --nics 2 --fault host_bound:start=4m,dur=9m",
                           "q: --nodes 9 --gpus 4 --nics 2 --nic-speed 400G",
                           "r: --nodes 6 --gpus 4 --nics 2 --fault pfc_storm:start=20m,dur=8m"]),
]


@pytest.mark.parametrize("seed,scrape,style,jobs", HELD_OUT, ids=[h[0] for h in HELD_OUT])
def test_unattributed_nodes_grouped_by_behaviour_held_out(tmp_path, seed, scrape, style, jobs):
    from gpunet.simulate.multijob import generate

    trace = tmp_path / f"held_{seed}.om.gz"
    argv = [str(trace), "--duration", "35m", "--scrape", scrape, "--seed", seed, "--hostname-style", style,
            "--no-workload-info"]
    for j in jobs:
        argv += ["--job", j]
    generate(argv)
    assert_per_job(run_json("--replay", str(trace)), labels_of(trace), attributed=False)


def test_one_job_without_workload_info_reads_as_before():
    """No workload information and one behaviour group: the output of a single-job cluster."""
    doc = run_json("--replay", str(REPO / "replay_data" / "healthy_confounders.om.gz"))
    assert "jobs" not in doc and all("job" not in f for f in doc["findings"])


def test_job_filter_and_text_grouped_by_job():
    trace = str(REPO / "replay_data" / "jobs3.om.gz")
    labels = labels_of(REPO / "replay_data" / "jobs3.om.gz")
    straggler = next(i for i in labels["incidents"] if i["class"] == "straggler")
    doc = run_json("--replay", trace, "--job", straggler["job"])
    assert [j["name"] for j in doc["jobs"]] == [straggler["job"]]
    assert [(f["job"], f["class"]) for f in doc["findings"]] == [(straggler["job"], "straggler")]
    text = diagnose("--replay", trace).stdout
    headings = [line for line in text.splitlines() if line.startswith("job ")]
    assert sorted(h.split()[1] for h in headings) == sorted(j["name"] for j in labels["jobs"])
    healthy = next(j["name"] for j in labels["jobs"] if j["name"] not in {i["job"] for i in labels["incidents"]})
    assert headings[-1].split()[1] == healthy  # the worst job first, the healthy one last
    md = diagnose("--replay", trace, "--format", "markdown").stdout
    assert f"## job {straggler['job']}" in md


def test_unknown_job_is_a_clear_error():
    result = diagnose("--replay", str(REPO / "replay_data" / "jobs2_straggler.om.gz"), "--job", "no-such-job")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    for job in labels_of(REPO / "replay_data" / "jobs2_straggler.om.gz")["jobs"]:
        assert job["name"] in result.stderr


def test_shared_node_belongs_to_the_job_holding_most_of_its_gpus():
    import pandas as pd

    from diagnoser.analysis.jobs import split
    from diagnoser.sources.replay import frame_from_trace

    trace = REPO / "replay_data" / "jobs2_straggler.om.gz"
    jobs = {j["name"]: j["nodes"] for j in labels_of(trace)["jobs"]}
    small, big = sorted(jobs, key=lambda n: len(jobs[n]))
    frame = frame_from_trace(trace)
    node = jobs[small][0]
    # a second workload on one GPU of that node for the whole window
    wl = frame.workloads
    extra = wl[(wl["instance"] == node) & (wl["gpu"] == "0")].assign(workload="notebook")
    frame.workloads = pd.concat([wl, extra], ignore_index=True)
    found = {j.name: j for j in split(frame)}
    assert node in found[small].instances and "notebook" not in found
    assert any(node in n and "shared" in n for j in found.values() for n in j.notes)


def _jobs3_with(rewrite):
    """jobs3's frame with its workload rows rewritten, then split and diagnosed per job."""
    from diagnoser.pipeline import diagnose_frame
    from diagnoser.sources.replay import frame_from_trace

    trace = REPO / "replay_data" / "jobs3.om.gz"
    frame = frame_from_trace(trace)
    frame.workloads = rewrite(frame.workloads)
    return diagnose_frame(frame).to_dict(), labels_of(trace)


@pytest.mark.parametrize("fallback", ["command name", "pod uid"])
def test_exporter_fallback_names_are_not_jobs(fallback):
    # The exporter's last resorts name no job: every job's processes are `python3`, and a
    # pod UID from a cgroup differs on every node. With only those, the nodes are grouped
    # by behaviour exactly as with no workload information at all.
    import pandas as pd

    from diagnoser.model.columns import WORKLOAD_COLUMNS
    from diagnoser.pipeline import diagnose_frame
    from diagnoser.sources.replay import frame_from_trace

    trace = REPO / "replay_data" / "jobs3_no_workload_info.om.gz"
    frame = frame_from_trace(trace)
    assert not len(frame.workloads)
    rows = [(i, "0", "python3" if fallback == "command name" else f"pod-{i}",
             "process" if fallback == "command name" else "kubernetes", "", float(w))
            for i in frame.instances for w in frame.windows]
    frame.workloads = pd.DataFrame(rows, columns=WORKLOAD_COLUMNS)
    doc = diagnose_frame(frame).to_dict()
    assert_per_job(doc, labels_of(trace), attributed=False)


def test_node_without_attribution_joins_the_job_it_moves_with():
    # The straggler's own node lost its attribution (its kubelet socket failed): it still
    # belongs to its job, and the straggler is still found there.
    straggler = next(i for i in labels_of(REPO / "replay_data" / "jobs3.om.gz")["incidents"]
                     if i["class"] == "straggler")
    doc, labels = _jobs3_with(lambda wl: wl[~wl["instance"].isin(straggler["nodes"])])
    assert_per_job(doc, labels, attributed=True)
    assert any("no workload information" in n for n in doc.get("notes", [])), doc.get("notes")


# --- NCCL inspector input -----------------------------------------------------------------------

def nccl_dump(hosts: dict[str, float], comm: str = "0x5e1f", stamp: str = "2026-01-01T00:15:00Z",
              gpus: int = 4) -> str:
    """The inspector's Prometheus dump (NCCL_INSPECTOR_PROM_DUMP): one line per metric per rank."""
    lines = []
    for h, (host, busbw) in enumerate(hosts.items()):
        for g in range(gpus):
            rank = h * gpus + g
            labels = (f'comm_id="{comm}",hostname="{host}",rank="{rank}",slurm_job="unknown",'
                      f'slurm_job_id="unknown",nranks="{len(hosts) * gpus}",n_nodes="{len(hosts)}",'
                      f'gpu_device_id="GPU{g}",collective="AllReduce",coll_sn="{1000 + rank}",'
                      f'timestamp="{stamp}",message_size="512.00MB"')
            lines.append(f"nccl_algorithm_bandwidth_gbs{{{labels}}} {busbw / 1.9:.6g}")
            lines.append(f"nccl_bus_bandwidth_gbs{{{labels}}} {busbw:.6g}")
            lines.append(f"nccl_collective_exec_time_microseconds{{{labels}}} {1e6 / busbw:.6g}")
    return "\n".join(lines) + "\n"


def test_nccl_late_rank_is_evidence_on_the_straggler(tmp_path):
    trace = REPO / "replay_data" / "jobs3.om.gz"
    labels = labels_of(trace)
    incident = next(i for i in labels["incidents"] if i["class"] == "straggler")
    culprit = incident["nodes"][0]
    nodes = next(j["nodes"] for j in labels["jobs"] if j["name"] == incident["job"])
    # the late rank measures a short collective: its bus bandwidth far above the others'
    hosts = {n.rsplit(":", 1)[0]: (300.0 if n == culprit else 150.0) for n in nodes}
    dump = tmp_path / "nccl_inspector_metrics_GPU-1.prom"
    dump.write_text(nccl_dump(hosts, stamp="2026-01-01T00:16:00Z"))
    doc = run_json("--replay", str(trace), "--nccl", str(tmp_path))
    f = next(f for f in doc["findings"] if f["class"] == "straggler")
    assert f["job"] == incident["job"] and list(f["evidence"]["nccl_bus_bandwidth"]) == [culprit]
    assert len(doc["findings"]) == len(labels["incidents"])


def test_nccl_slow_rank_raises_a_finding_where_counters_are_silent(tmp_path):
    trace = REPO / "replay_data" / "healthy_basic.om.gz"
    from diagnoser.sources.replay import frame_from_trace

    instances = frame_from_trace(trace).instances
    slow = instances[2]
    hosts = {n.rsplit(":", 1)[0]: (60.0 if n == slow else 180.0) for n in instances}
    dump = tmp_path / "dump.prom"
    dump.write_text("# HELP ignored\n" + nccl_dump(hosts, stamp="2026-01-01T00:10:00Z"))
    doc = run_json("--replay", str(trace), "--nccl", str(dump))
    assert [(f["class"], f["nodes"]) for f in doc["findings"]] == [("link_degraded", [slow])]
    assert "NCCL" in doc["findings"][0]["evidence"]["from"]
    # outside the window: no figure to use
    dump.write_text(nccl_dump(hosts, stamp="2027-01-01T00:10:00Z"))
    doc = run_json("--replay", str(trace), "--nccl", str(dump))
    assert doc["findings"] == [] and any("NCCL" in n for n in doc["notes"])


def test_nccl_bad_dump_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.prom"
    bad.write_text('nccl_bus_bandwidth_gbs{rank="1" 12\n')
    result = diagnose("--replay", str(REPO / "replay_data" / "healthy_basic.om.gz"), "--nccl", str(bad))
    assert result.returncode == 1 and f"{bad}:1" in result.stderr and "Traceback" not in result.stderr


def trace_with_nccl(tmp_path, trace, hosts: dict[str, float]):
    """The trace with the inspector's series as Prometheus would have scraped them (node_exporter's
    textfile collector on port 9100): a family of its own, a timestamp on every sample."""
    import gzip

    text = gzip.open(trace, "rt").read().rstrip("\n")
    assert text.endswith("# EOF")
    lines = ["# TYPE nccl_bus_bandwidth_gbs gauge"]
    for h, (host, busbw) in enumerate(hosts.items()):
        for g in range(4):
            labels = (f'comm_id="0xabc",collective="AllReduce",gpu_device_id="GPU{g}",hostname="{host}",'
                      f'instance="{host}:9100",job="node",message_size="1.00GB",rank="{4 * h + g}"')
            for k in range(10):  # every 60 s from minute 5
                lines.append(f"nccl_bus_bandwidth_gbs{{{labels}}} {busbw + 0.1 * k:.2f} {1767225900 + 60 * k}")
    out = tmp_path / f"nccl-{trace.name}"
    with gzip.open(out, "wt") as f:
        f.write(text[: -len("# EOF")] + "\n".join(lines) + "\n# EOF\n")
    return out


def test_nccl_series_in_the_trace_and_in_prometheus(tmp_path, request):
    from diagnoser.sources.replay import frame_from_trace

    trace = REPO / "replay_data" / "healthy_basic.om.gz"
    instances = frame_from_trace(trace).instances
    slow = instances[-1]
    served = trace_with_nccl(tmp_path, trace, {n.rsplit(":", 1)[0]: (50.0 if n == slow else 170.0)
                                                for n in instances})
    doc = run_json("--replay", str(served))
    assert [(f["class"], f["nodes"]) for f in doc["findings"]] == [("link_degraded", [slow])]
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed")
    from test_diagnoser_prometheus import window

    start, end = window(trace)
    doc = run_json("--prometheus", request.getfixturevalue("served")(served), "--start", start, "--end", end)
    assert [(f["class"], f["nodes"]) for f in doc["findings"]] == [("link_degraded", [slow])]


def test_html_report_compares_culprits_with_their_own_job(tmp_path):
    trace = REPO / "replay_data" / "jobs3.om.gz"
    labels = labels_of(trace)
    incident = next(i for i in labels["incidents"] if i["class"] == "straggler")
    size = len(next(j["nodes"] for j in labels["jobs"] if j["name"] == incident["job"]))
    page = tmp_path / "report.html"
    assert diagnose("--replay", str(trace), "--html", str(page)).returncode == 0
    text = page.read_text()
    assert f"peer median ({size - 1} nodes)" in text and incident["nodes"][0] in text
    assert text.count('class="finding"') >= len(labels["incidents"]) and f"job {incident['job']}" in text
