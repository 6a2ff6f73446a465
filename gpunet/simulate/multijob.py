"""Several training jobs in one cluster: one trace, per-job ground truth.

    python -m gpunet.simulate.multijob OUT.om.gz --duration 30m --scrape 30s --seed 7 \\
        --job 'llm-pretrain: --nodes 12 --gpus 4 --nics 2' \\
        --job 'recsys: --nodes 6 --gpus 4 --nics 2 --nic-speed 25G --fault network_bandwidth:start=8m,dur=14m' \\
        --job 'vision: --nodes 8 --gpus 4 --nics 2 --fault straggler:start=10m,dur=10m'

Each job is simulated as its own cluster (its own size, speed, behaviour and faults: the
`gpunet-simulate` options after the name), on its own fabric; with --shared-fabric the jobs
share one spine-leaf fabric, so that a PFC storm from one job's node pauses and freezes the
links of every other job too (the same storm, as a victim sees it). The nodes are then given
distinct hostnames of one style, spread over the cluster at random (jobs are not placed in
name order on real clusters), and the series merged into one trace with each metric
family contiguous (docs/trace-format.md). Every GPU gets its gpunet_gpu_workload_info series
(source kubernetes), unless --no-workload-info: then only behaviour tells the jobs apart.

labels.json: the incidents of every job, each with a `job` key, and `jobs`: each job's
instances; with --shared-fabric, `waited_on`: each job that waited on another job's
incident ({job, cause_job, class, start, end, nodes}), which is no incident of its own.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from gpunet import contract as C
from gpunet.simulate.cli import build_parser as simulate_parser
from gpunet.simulate.cli import spec_from_args
from gpunet.simulate.cluster import hostname
from gpunet.simulate.faults import FROM_OUTSIDE
from gpunet.simulate.params import HOSTNAME_STYLES
from gpunet.trace import TraceWriter, timestamp_suffixes


def parse_job(text: str) -> tuple[str, list[str]]:
    name, colon, rest = text.partition(":")
    if not colon or not name.strip():
        raise ValueError(f"--job {text!r}: expected 'NAME: gpunet-simulate options'")
    return name.strip(), shlex.split(rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpunet.simulate.multijob", description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--job", action="append", required=True, metavar="'NAME: OPTIONS'")
    p.add_argument("--duration", default="30m")
    p.add_argument("--scrape", default="30s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hostname-style", choices=HOSTNAME_STYLES, default="node")
    p.add_argument("--port", type=int, default=C.DEFAULT_PORT)
    p.add_argument("--namespace", default="training")
    p.add_argument("--no-workload-info", action="store_true", help="leave gpunet_gpu_workload_info out")
    p.add_argument("--compress-level", type=int, default=6)
    p.add_argument("--shared-fabric", action="store_true",
                   help="the jobs share one fabric: a PFC storm in one job pauses the others' links too")
    return p


# Faults whose effect crosses from one job to the others on a shared fabric: a storming NIC
# fills its switch's buffers and the pauses spread up the spine to every job behind it.
SPILLS = ("pfc_storm",)


def spill(jobs: list[tuple[str, list[str]]]) -> tuple[list[tuple[str, list[str]]], list[tuple[int, int, str]]]:
    """Each job's options with the other jobs' spilling faults added as `from_outside`
    faults, and (victim job, source job, fault text) for each."""
    added: list[tuple[int, int, str]] = []
    for source, (_, opts) in enumerate(jobs):
        for flag, text in zip(opts, opts[1:]):
            if flag == "--fault" and text.split(":", 1)[0] in SPILLS and FROM_OUTSIDE not in text:
                added += [(victim, source, text) for victim in range(len(jobs)) if victim != source]
    out = [(name, list(opts)) for name, opts in jobs]
    for victim, _, text in added:
        cls, _, rest = text.partition(":")
        kept = ",".join(kv for kv in rest.split(",") if kv.split("=")[0] in ("start", "dur", "end", "strength"))
        out[victim][1].extend(["--fault", f"{cls}:{kept},variant={FROM_OUTSIDE}"])
    return out, added


def generate(argv: list[str]) -> dict:
    from gpunet.simulate.engine import simulate

    args = build_parser().parse_args(argv)
    jobs = [parse_job(j) for j in args.job]
    spilled: list[tuple[int, int, str]] = []
    if args.shared_fabric:
        jobs, spilled = spill(jobs)
    results = []
    for k, (name, opts) in enumerate(jobs):
        common = ["--duration", args.duration, "--scrape", args.scrape, "--seed", str(args.seed * 100 + k),
                  "--port", str(args.port)]
        sim_args = simulate_parser().parse_args(common + opts + ["job.om.gz"])
        results.append((name, simulate(spec_from_args(sim_args, opts))))
    # Distinct hostnames, jobs interleaved over the cluster.
    total = sum(len(r.nodes) for _, r in results)
    order = np.random.default_rng([args.seed, 9]).permutation(total)
    k = 0
    for _name, r in results:
        r.cluster.instances = [hostname(args.hostname_style, int(order[k + i]), r.spec.cluster.gpu_model) +
                               f":{args.port}" for i in range(len(r.nodes))]
        k += len(r.nodes)
    stats = write(results, args.out, not args.no_workload_info, args.namespace, args.compress_level)
    labels = {"incidents": [], "jobs": [], "notes": "python -m gpunet.simulate.multijob " +
              " ".join(shlex.quote(a) if a != args.out else Path(a).name for a in argv)}
    for name, r in results:
        workload = f"{args.namespace}/{name}"
        labels["jobs"].append({"name": workload, "nodes": sorted(r.cluster.instances),
                               "gpus_per_node": r.spec.cluster.gpus})
        labels["incidents"] += [{**i, "job": workload} for i in r.labels()["incidents"]]
    labels["incidents"].sort(key=lambda i: (i["start"], i["job"], i["class"]))
    if spilled:
        labels["waited_on"] = []
        for victim, source, text in spilled:
            cls = text.split(":", 1)[0]
            cause_job = f"{args.namespace}/{results[source][0]}"
            for i in labels["incidents"]:
                if i["job"] == cause_job and i["class"] == cls:
                    labels["waited_on"].append({"job": f"{args.namespace}/{results[victim][0]}", "cause_job": cause_job,
                                                "class": cls, "start": i["start"], "end": i["end"], "nodes": i["nodes"]})
    path = Path(str(args.out).removesuffix(".gz").removesuffix(".om") + ".labels.json")
    path.write_text(json.dumps(labels, indent=1) + "\n")
    return {**stats, "incidents": labels["incidents"], "jobs": labels["jobs"]}


def write(results: list, out: str, workload_info: bool, namespace: str, compresslevel: int) -> dict:
    """Every family once, its series from every job's nodes (docs/trace-format.md)."""
    from gpunet.simulate.output import FAMILIES, _format

    families = list(FAMILIES) + ([(C.GPU_WORKLOAD_INFO, "int")] if workload_info else [])
    nodes = [(name, r, i, node) for name, r in results for i, node in enumerate(r.nodes)]
    suffixes = [timestamp_suffixes(node.times.tolist()) for _, _, _, node in nodes]
    n_series = 0
    with TraceWriter(out, compresslevel=compresslevel) as w:
        for metric, kind in families:
            if metric is C.GPU_WORKLOAD_INFO:
                # As the exporter names a Kubernetes workload: <namespace>/<job of the pod>.
                per_node = [[({"gpu": g.index, "workload": f"{namespace}/{name}", "source": "kubernetes",
                               "namespace": namespace, "pod": f"{name}-worker-{i}", "container": "trainer"},
                              np.ones(len(node.times)))
                             for g in r.cluster.gpus[i]] for name, r, i, node in nodes]
            else:
                per_node = [node.series.get(metric.name, ()) for _, _, _, node in nodes]
            if not any(per_node):
                continue
            w.family(metric.name, metric.type, metric.help)
            for (_name, r, i, _node), series, sfx in zip(nodes, per_node, suffixes):
                for labels, values in series:
                    present = ~np.isnan(values)
                    if not present.any():
                        continue
                    s = sfx if present.all() else [sfx[j] for j in np.flatnonzero(present)]
                    w.series_formatted(metric.name, {**labels, "instance": r.cluster.instances[i],
                                                     "job": r.spec.cluster.job}, _format(values[present], kind), s)
                    n_series += 1
        samples = w.samples
    return {"series": n_series, "samples": samples, "bytes": Path(out).stat().st_size}


# The committed multi-job traces (replay_data/): python -m gpunet.simulate.multijob --committed replay_data/
SMALL = "--gpus 4 --nics 2"
COMMITTED = {
    "jobs2_straggler": ("two jobs: a healthy 8-node job and a 6-node job with a straggler",
                        ["--duration", "30m", "--scrape", "30s", "--seed", "201", "--compress-level", "9",
                         "--job", f"llm-pretrain: --nodes 8 {SMALL}",
                         "--job", f"vision-ft: --nodes 6 {SMALL} --fault straggler:start=10m,dur=10m"]),
    "jobs3": ("three jobs: healthy (12 nodes), network-bound on 25G links (6 nodes), a straggler (8 nodes)",
              ["--duration", "30m", "--scrape", "30s", "--seed", "202", "--compress-level", "9",
               "--hostname-style", "rack",
               "--job", f"llm-a: --nodes 12 {SMALL}",
               "--job", f"recsys-b: --nodes 6 {SMALL} --nic-speed 25G "
                        "--fault network_bandwidth:start=8m,dur=14m,strength=2.5",
               "--job", f"moe-c: --nodes 8 {SMALL} --fault straggler:start=12m,dur=10m,variant=trickle"]),
    "jobs3_no_workload_info": ("three jobs as in jobs3 (other seed, 20 s scrapes, incidents at other times) "
                               "without gpunet_gpu_workload_info: only behaviour groups the nodes",
                               ["--duration", "30m", "--scrape", "20s", "--seed", "203", "--compress-level", "9",
                                "--no-workload-info",
                                "--job", f"llm-a: --nodes 12 {SMALL}",
                                "--job", f"recsys-b: --nodes 6 {SMALL} --nic-speed 25G "
                                         "--fault network_bandwidth:start=4m,dur=10m,strength=2.5",
                                "--job", f"moe-c: --nodes 8 {SMALL} --fault straggler:start=17m,dur=10m"]),
    "jobs2_shared_storm": ("two jobs on one spine-leaf fabric: a PFC storm from a node of one pauses the other's "
                           "links too; the cause is reported once, in the job of its source",
                           ["--duration", "30m", "--scrape", "30s", "--seed", "204", "--compress-level", "9",
                            "--shared-fabric",
                            "--job", f"llm-a: --nodes 8 {SMALL} --fault pfc_storm:start=11m,dur=8m",
                            "--job", f"vision-b: --nodes 6 {SMALL}"]),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--committed"]:
        outdir = Path(argv[1] if len(argv) > 1 else "replay_data")
        for name, (_, opts) in COMMITTED.items():
            stats = generate([str(outdir / f"{name}.om.gz"), *opts])
            print(f"{name}: {stats['series']} series, {stats['bytes'] / 1e3:.0f} kB, "
                  f"{len(stats['incidents'])} incident(s)", file=sys.stderr)
        return 0
    try:
        stats = generate(argv)
    except ValueError as e:
        print(f"multijob: {e}", file=sys.stderr)
        return 2
    print(f"{argv[0]}: {stats['series']} series, {len(stats['jobs'])} jobs, {len(stats['incidents'])} incident(s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
