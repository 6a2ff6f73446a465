"""Capacity advice and cost: the arithmetic on hand-checked numbers, and the advice checked
against the physics: the same job simulated again at the advised speed meets the target,
and below the advised minimum it cannot."""

import argparse
import json

import numpy as np
import pytest

from diagnoser.analysis.capacity import needed_speed, upgrade_step
from diagnoser.cli import main as diagnose
from diagnoser.cli import parse_count
from gpunet import contract as C
from gpunet.simulate.cli import build_parser, spec_from_args
from gpunet.simulate.conditions import gradient_bytes
from gpunet.simulate.engine import simulate
from gpunet.simulate.output import write_trace
from gpunet.simulate.readback import series_of

# A data-parallel job whose gradient outgrows 25G links for the whole trace.
NODES, GPUS, NICS = 8, 4, 2
JOB = (f"--nodes {NODES} --gpus {GPUS} --nics {NICS} --duration 20m --scrape 30s --seed 7701 "
       "--fault network_bandwidth:start=0,dur=all,strength=2.5")
TARGET = 0.05
G = 1e9 / 8  # bytes/s per Gb/s


def test_needed_speed_on_hand_computed_numbers():
    # 25G links at line rate half the time; 30% of GPU time idles in those ticks.
    low, high = needed_speed(25 * G, 0.5, 0.3, 0.05)
    assert low / G == pytest.approx(25 * 0.5 / (0.5 - 0.3 + 0.05))  # 50 Gb/s
    assert high / G == pytest.approx(25 * 0.3 / 0.05)  # 150 Gb/s
    assert upgrade_step(high / G, 25) == "200G per NIC"
    assert upgrade_step(low / G, 25) == "100G per NIC"
    assert upgrade_step(900, 400).startswith("more rails: 2 x 800G")
    # Within the target already: no need beyond what there is.
    assert needed_speed(25 * G, 0.5, 0.04, 0.05) == (25 * G, 25 * G)
    assert upgrade_step(25, 25).startswith("none")
    # Nothing to size without line-rate time or speed.
    assert all(np.isnan(needed_speed(0.0, 0.5, 0.3)))
    assert all(np.isnan(needed_speed(25 * G, 0.0, 0.3)))


def test_model_size_parsing():
    assert parse_count("10B") == 10e9
    assert parse_count("350M") == 350e6
    assert parse_count("7e9") == 7e9
    with pytest.raises(argparse.ArgumentTypeError, match="not a count"):
        parse_count("ten")


def run_job(tmp_path, speed: str, gradient: float | None = None):
    """The job on links of `speed`; the same model (gradient bytes) when given."""
    extra = ["--gradient-bytes", str(gradient)] if gradient else []
    args = build_parser().parse_args(JOB.split() + extra + ["--nic-speed", speed,
                                                            str(tmp_path / f"job-{speed}.om.gz")])
    result = simulate(spec_from_args(args))
    write_trace(result, args.out)
    return result, args.out


def idle_saturated_truth(result) -> float:
    """GPU idle in saturated ticks / GPU time, from the simulator's own counters."""
    idle_sat = total = 0.0
    for (name, labels), (_, values) in series_of(result).items():
        grown = float(values[-1] - values[0])
        if name == C.GPU_IDLE_SECONDS.name:
            total += grown
            if dict(labels)["network_state"] == "saturated":
                idle_sat += grown
        elif name == C.GPU_BUSY_SECONDS.name:
            total += grown
    return idle_sat / total


def diagnosis(path, capsys, *extra) -> dict:
    assert diagnose(["--replay", str(path), "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_advised_range_brackets_the_speed_that_meets_the_target(tmp_path, capsys):
    slow, path = run_job(tmp_path, "25G")
    measured = idle_saturated_truth(slow)
    assert measured > 0.15, "the job is not network-bound at 25G: the test means nothing"
    cap = diagnosis(path, capsys)["capacity"]
    low, high = cap["needed_gbps_per_nic_at_least"], cap["needed_gbps_per_nic"]
    assert 25 < low < high
    assert cap["gpu_idle_saturated_fraction"] == pytest.approx(measured, abs=0.03)

    # The job again on links as fast as the upper bound: its GPUs no longer wait on them.
    model = gradient_bytes(slow.spec)  # the simulator sizes the model from its link speed: hold it
    fast, _ = run_job(tmp_path, f"{np.ceil(high):.0f}G", model)
    assert idle_saturated_truth(fast) <= TARGET + 0.01
    # ... and below the lower bound no overlap can save it.
    short, _ = run_job(tmp_path, f"{0.8 * low:.0f}G", model)
    assert idle_saturated_truth(short) > TARGET
    print(f"\n[capacity] 25G: idle at line rate {measured:.3f}; advised {low:.0f}..{high:.0f} Gb/s; "
          f"at {np.ceil(high):.0f}G {idle_saturated_truth(fast):.3f}, at {0.8 * low:.0f}G "
          f"{idle_saturated_truth(short):.3f}")


def test_bursts_give_the_step_rhythm_and_bytes(tmp_path, capsys):
    result, path = run_job(tmp_path, "25G")
    cap = diagnosis(path, capsys, "--model-params", "1B")["capacity"]
    steps_per_second = len(result.schedule.t0) / result.spec.duration
    # One all-reduce phase per step, each separated by the step's compute.
    assert cap["bursts_per_second"] == pytest.approx(steps_per_second, rel=0.1)
    assert cap["model"]["allreduce_bytes_per_node"] == pytest.approx(2 * (NODES * GPUS - 1) / (NODES * GPUS) * 2e9)


def test_cost_follows_the_price_and_the_gpu_time(tmp_path, capsys):
    result, path = run_job(tmp_path, "25G")
    doc = diagnosis(path, capsys, "--gpu-hour-price", "3", "--currency", "USD")
    cost = doc["cost"]
    gpu_hours = NODES * GPUS * result.spec.duration / 3600
    assert cost["gpu_hours"] == pytest.approx(gpu_hours, rel=0.05)
    assert cost["gpu_hours_idle"] == pytest.approx(cost["gpu_hours"] * doc["gpu_idle_fraction"], abs=0.02)
    assert doc["findings"], "a network-bound job with no finding"
    for f in doc["findings"]:
        assert f["cost"] == pytest.approx(f["gpu_idle_seconds"] / 3600 * 3, abs=0.01)
    assert cost["lost"] == pytest.approx(cost["gpu_hours_lost_to_findings"] * 3, abs=0.03)  # hours are rounded
    # Per day: what still goes on at the window's end, at its own rate (the job is network-bound throughout).
    ongoing = [f for f in doc["findings"] if f["ongoing"]]
    assert ongoing, doc["findings"]
    per_day = sum(f["gpu_idle_seconds"] / (f["end"] - f["start"]) for f in ongoing) * 86400 / 3600 * 3
    assert cost["lost_per_day"] == pytest.approx(per_day, rel=0.01)
    # Without a price: hours, no money.
    plain = diagnosis(path, capsys)
    assert "lost" not in plain["cost"] and all("cost" not in f for f in plain["findings"])


def test_healthy_job_needs_no_upgrade(capsys):
    doc = diagnosis("replay_data/healthy_basic.om.gz", capsys)
    assert doc["capacity"]["upgrade_to"] is None, doc["capacity"]
    assert doc["capacity"]["gpu_idle_saturated_fraction"] < TARGET


def test_several_jobs_get_their_own_capacity_and_cost(capsys):
    # Three jobs on one cluster (replay_data/jobs3): capacity is sized per job, from that
    # job's traffic, and every finding carries its cost in the cluster's currency.
    path = "replay_data/jobs3.om.gz"
    labels = json.loads(open(path.replace(".om.gz", ".labels.json")).read())
    doc = diagnosis(path, capsys, "--gpu-hour-price", "2", "--currency", "EUR")
    jobs = {j["name"]: j for j in doc["jobs"]}
    assert set(jobs) == {j["name"] for j in labels["jobs"]}
    bound = {i["job"] for i in labels["incidents"] if i["class"] == "network_bandwidth"}
    assert bound, "the trace lost its network-bound job: the test means nothing"
    for name in bound:
        assert jobs[name]["capacity"]["upgrade_to"], jobs[name]["capacity"]
    speeds = {name: j["capacity"]["nic_speed_gbps"] for name, j in jobs.items()}
    assert len(set(speeds.values())) > 1, "jobs on different fabrics should be sized on their own links"
    for f in doc["findings"]:
        assert f["cost"] == pytest.approx(f["gpu_idle_seconds"] / 3600 * 2, abs=0.01)
    assert doc["cost"]["currency"] == "EUR" and "configuration" in doc
    assert diagnose(["--replay", path, "--gpu-hour-price", "2", "--currency", "EUR"]) == 0
    text = capsys.readouterr().out
    assert text.count("Network capacity:") == len(jobs) and "EUR" in text and "Configuration" in text


def test_job_filter_reports_the_jobs_own_size_and_cost(capsys):
    path = "replay_data/jobs3.om.gz"
    labels = json.loads(open(path.replace(".om.gz", ".labels.json")).read())
    job = next(j for j in labels["jobs"] if j["name"].endswith("moe-c"))
    doc = diagnosis(path, capsys, "--job", job["name"], "--gpu-hour-price", "2")
    assert doc["nodes"] == len(job["nodes"]) and doc["gpus"] == len(job["nodes"]) * job["gpus_per_node"]
    hours = doc["gpus"] * (doc["end"] - doc["start"]) / 3600
    assert doc["cost"]["gpu_hours"] == pytest.approx(hours, rel=0.05)


def test_one_node_job_moves_nothing_over_the_fabric(tmp_path, capsys):
    args = build_parser().parse_args(["--nodes", "1", "--gpus", "8", "--nics", "2", "--duration", "10m",
                                      "--scrape", "15s", "--seed", "7702", str(tmp_path / "one.om.gz")])
    write_trace(simulate(spec_from_args(args)), args.out)
    cap = diagnosis(args.out, capsys, "--model-params", "7B")["capacity"]
    assert cap["model"]["allreduce_bytes_per_node"] == 0


def test_an_incident_that_ended_costs_what_it_cost_and_nothing_a_day(capsys):
    """The storm ended minutes before the trace does: whatever window is asked for, the cost
    per day is zero and the storm's cost is the same."""
    costs = set()
    for since in ("25m", "29m", "30m"):
        doc = diagnosis("replay_data/pfc_storm.om.gz", capsys, "--since", since)
        (storm,) = doc["findings"]
        assert not storm["ongoing"]
        assert doc["cost"]["gpu_hours_lost_per_day"] == 0
        costs.add(storm["gpu_idle_seconds"])
    assert len(costs) == 1, costs


@pytest.mark.parametrize("name", ["gpu_throttle", "straggler_trickle", "host_bound", "healthy_basic",
                                  "healthy_confounders", "healthy_join_leave"])
def test_no_faster_links_beside_a_cause_that_explains_the_idle_or_within_the_noise(capsys, name):
    """Faster NICs give back only the idle spent waiting on links at line rate that no
    finding explains, and only beyond the figure's own window-to-window noise."""
    cap = diagnosis(f"replay_data/{name}.om.gz", capsys)["capacity"]
    assert cap["upgrade_to"] is None, cap["verdict"]
    assert cap["gpu_idle_saturated_noise"] is not None and cap["gpu_idle_saturated_noise"] >= 0
