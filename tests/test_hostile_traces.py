"""Hostile input to `diagnose --replay`: damaged traces built from a committed one.

Recoverable damage (duplicates, samples out of order, NaN/Inf/negative counters, series
outside the contract, a family split in two, a sample without timestamp, malformed labels,
a value that is no number, a last line cut short) -> exit 0, a warning naming the place,
the same diagnosis as the clean trace. Fatal damage (truncated gzip, a line of megabytes)
-> exit 1, one line naming file and line.
Never a traceback; memory bounded."""

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procs import REPO

BASE = REPO / "replay_data" / "pfc_storm.om.gz"
TX = "gpunet_nic_transmit_bytes_total"


def diagnose(*args: str, rss_file=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "diagnoser.cli", *args]
    if rss_file is not None:  # peak RSS of the diagnose process alone, in KiB
        cmd = ["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *cmd]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def base_lines() -> list[str]:
    return gzip.decompress(BASE.read_bytes()).decode().split("\n")


@pytest.fixture(scope="module")
def clean_findings() -> list:
    result = diagnose("--replay", str(BASE), "--format", "json")
    assert result.returncode == 0, result.stderr
    return summary(result)


def summary(result) -> list:
    return [(f["class"], f["nodes"]) for f in json.loads(result.stdout)["findings"]]


def write(path, lines, gz=True):
    data = "\n".join(lines).encode()
    path.write_bytes(gzip.compress(data, 1) if gz else data)
    return path


def series_lines(lines, name, instance="node-001:9845"):
    """Indexes (0-based) of the lines of the first series of `name` on `instance`."""
    hits = [i for i, l in enumerate(lines) if l.startswith(name + "{") and f'instance="{instance}"' in l]
    first = lines[hits[0]].rsplit(" ", 2)[0]
    return [i for i in hits if lines[i].rsplit(" ", 2)[0] == first]


def clean_stderr(result):
    assert "Traceback" not in result.stderr, result.stderr
    for line in result.stderr.splitlines():  # every line the diagnoser's own, no numpy/pandas warnings
        assert line.startswith("diagnose:"), result.stderr


def recovered(result, clean_findings, *places):
    clean_stderr(result)
    assert result.returncode == 0, result.stderr
    assert summary(result) == clean_findings
    warnings = [l for l in result.stderr.splitlines() if "warning" in l]
    for place in places:
        assert any(place in w for w in warnings), (place, result.stderr)
    assert len(warnings) <= 20, result.stderr  # bounded
    return warnings


def fatal(result, place):
    clean_stderr(result)
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert place in last and len(last) < 400, result.stderr
    return last


# ---- recoverable ----

def test_duplicate_samples_are_dropped_with_a_warning(tmp_path, base_lines, clean_findings):
    lines = list(base_lines)
    idx = series_lines(lines, TX)
    for i in reversed(idx[5:15]):
        lines.insert(i, lines[i])  # each of 10 samples twice
    trace = write(tmp_path / "dup.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    (w,) = recovered(result, clean_findings, f"{trace}:{idx[0] + 1}", TX)
    assert "10 duplicate" in w


def test_samples_out_of_order_are_sorted_with_a_warning(tmp_path, base_lines, clean_findings):
    lines = list(base_lines)
    idx = series_lines(lines, TX)
    for a in idx[10:30:2]:
        lines[a], lines[a + 1] = lines[a + 1], lines[a]
    trace = write(tmp_path / "order.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    (w,) = recovered(result, clean_findings, f"{trace}:{idx[0] + 1}", TX)
    assert "out of order" in w


def test_series_repeated_later_is_merged_not_double_counted(tmp_path, base_lines, clean_findings):
    """The node's transmit bytes appear twice, the second time after other series: summing
    both would double the bytes; they are merged, with a warning."""
    lines = list(base_lines)
    idx = series_lines(lines, TX, "node-011:9845")
    block = [lines[i] for i in idx]
    end_of_family = next(i for i in range(idx[-1], len(lines)) if lines[i].startswith("# TYPE"))
    lines[end_of_family:end_of_family] = block
    trace = write(tmp_path / "again.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    recovered(result, clean_findings, f"{trace}:{end_of_family + 1}", "again")


def test_family_out_of_place_is_read_with_a_warning(tmp_path, base_lines, clean_findings):
    """Samples of a family the diagnoser reads, moved without their TYPE line into a
    family it skips: read, not silently lost."""
    lines = list(base_lines)
    idx = series_lines(lines, "gpunet_nic_pfc_pause_frames_total", "node-011:9845")
    moved = [lines[i] for i in idx]
    for i in reversed(idx):
        del lines[i]
    lines[3:3] = moved  # inside gpunet_exporter_collector_up
    trace = write(tmp_path / "moved.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    recovered(result, clean_findings, f"{trace}:4", "gpunet_nic_pfc_pause_frames_total")


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "-5", "-1e300", "1e308"])
def test_non_finite_or_negative_counter_values_are_dropped(tmp_path, base_lines, clean_findings, bad):
    lines = list(base_lines)
    idx = series_lines(lines, TX)
    for i in idx[20:23]:
        key, _, ts = lines[i].rsplit(" ", 2)
        lines[i] = f"{key} {bad} {ts}"
    trace = write(tmp_path / "nan.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    (w,) = recovered(result, clean_findings, f"{trace}:{idx[0] + 1}", TX)
    assert "3 " in w


@pytest.mark.parametrize("name,bad", [("gpunet_nic_link_speed_bytes_per_second", "-25000000000"),
                                      ("gpunet_nic_link_speed_bytes_per_second", "1e308"),
                                      ("gpunet_nic_rdma_loss_events_total", "1e308")])
def test_impossible_gauges_and_counters_make_no_phantom_finding(tmp_path, base_lines, clean_findings, name, bad):
    """A negative link speed is no degraded link; a loss counter at 1e308 is no packet loss."""
    lines = list(base_lines)
    idx = series_lines(lines, name)
    assert idx, name
    for i in idx[20:23]:
        key, _, ts = lines[i].rsplit(" ", 2)
        lines[i] = f"{key} {bad} {ts}"
    trace = write(tmp_path / "impossible.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    recovered(result, clean_findings, f"{trace}:{idx[0] + 1}", name)


def test_non_finite_timestamps_are_dropped(tmp_path, base_lines, clean_findings):
    lines = list(base_lines)
    idx = series_lines(lines, TX)
    for i, bad in zip(idx[20:23], ("NaN", "+Inf", "-Inf")):
        key, value, _ = lines[i].rsplit(" ", 2)
        lines[i] = f"{key} {value} {bad}"
    trace = write(tmp_path / "ts.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    recovered(result, clean_findings, f"{trace}:{idx[0] + 1}", TX)


def test_sample_days_out_of_order_is_ignored_not_stretching_the_windows(tmp_path, base_lines, clean_findings):
    lines = list(base_lines)
    idx = series_lines(lines, TX)
    key, value, ts = lines[idx[30]].rsplit(" ", 2)
    lines[idx[30]] = f"{key} {value} {float(ts) - 11 * 86400}"  # 11 days early, amid the series
    trace = write(tmp_path / "stray.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    recovered(result, clean_findings, f"{trace}:{idx[0] + 1}", "out of order", "far outside the trace's time range")


def test_last_line_without_newline_is_fine(tmp_path, base_lines, clean_findings):
    trace = write(tmp_path / "nolf.om", "\n".join(base_lines).rstrip("\n").split("\n"), gz=False)
    assert trace.read_bytes().endswith(b"# EOF")
    result = diagnose("--replay", str(trace), "--format", "json")
    clean_stderr(result)
    assert result.returncode == 0 and summary(result) == clean_findings and "warning" not in result.stderr


def test_hundreds_of_thousands_of_unknown_series_bounded_memory(tmp_path, base_lines, clean_findings):
    """300k series outside the contract, half in a family of their own, half without a
    TYPE line after the last gpunet family: skipped fast, one warning, memory bounded."""
    lines = list(base_lines)
    assert lines[-2] == "# EOF"
    ts = lines[-3].rsplit(" ", 1)[1]
    junk = ["# TYPE junk_requests counter"]
    junk += [f'junk_requests_total{{instance="x{i}:1",path="/p/{i}"}} {i} {ts}' for i in range(150_000)]
    untyped = [f'junk_{i}{{instance="y{i}:1"}} {i} {ts}' for i in range(150_000)]
    lines[-2:-2] = untyped  # after gpunet_tcp_sent_segments, no TYPE line
    lines[1:1] = junk + [lines[0]]  # a family of its own at line 2, then collector_up's TYPE again
    trace = write(tmp_path / "junk.om.gz", lines)
    rss = tmp_path / "rss"
    result = diagnose("--replay", str(trace), "--format", "json", rss_file=rss)
    recovered(result, clean_findings, f"{trace}:2", "junk_requests", "junk_0")
    peak_mb = int(rss.read_text().split()[-1]) / 1024
    assert peak_mb < 600, peak_mb


# ---- fatal ----

@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.999])
def test_truncated_gzip_names_file_and_line(tmp_path, fraction):
    data = BASE.read_bytes()
    cut = tmp_path / "cut.om.gz"
    cut.write_bytes(data[: int(len(data) * fraction)])
    last = fatal(diagnose("--replay", str(cut)), f"{cut}:")
    assert "truncated or corrupt" in last


@pytest.mark.parametrize("where,size", [("sample", 3 << 20), ("help", 3 << 20), ("sample", 9 << 20),
                                        ("skipped", 3 << 20)])
def test_line_of_megabytes_is_refused(tmp_path, base_lines, where, size):
    lines = list(base_lines)
    if where == "skipped":  # inside a family the diagnoser does not read
        at = 5
        lines.insert(at, 'gpunet_exporter_collector_up{collector="' + "x" * size + '"} 1 1767225617')
    elif where == "help":
        at = series_lines(lines, TX)[0] - 1
        lines.insert(at, "# HELP gpunet_nic_transmit_bytes " + "y" * size)
    else:
        at = series_lines(lines, TX)[3]
        lines.insert(at, TX + '{device="' + "z" * size + '",instance="node-001:9845"} 1 1767225617')
    trace = write(tmp_path / "long.om.gz", lines)
    last = fatal(diagnose("--replay", str(trace)), f"{trace}:{at + 1}:")
    assert "line of over" in last


# ---- one damaged line: warned about, the rest read ----

def test_sample_without_timestamp_is_skipped_with_a_warning(tmp_path, base_lines, clean_findings):
    lines = list(base_lines)
    at = series_lines(lines, TX)[7]
    lines[at] = lines[at].rsplit(" ", 1)[0]
    trace = write(tmp_path / "nots.om.gz", lines)
    recovered(diagnose("--replay", str(trace), "--format", "json"), clean_findings, f"{trace}:{at + 1}:")


def test_a_value_that_is_no_number_is_dropped_with_a_warning(tmp_path, base_lines, clean_findings):
    lines = list(base_lines)
    at = series_lines(lines, TX)[9]
    key, _, ts = lines[at].rsplit(" ", 2)
    lines[at] = f"{key} 12x4 {ts}"
    trace = write(tmp_path / "nan.om.gz", lines)
    warnings = recovered(diagnose("--replay", str(trace), "--format", "json"), clean_findings,
                         f"{trace}:{at + 1}: not a number: value '12x4'")
    # said once, as what it is: not counted again among the NaN or negative values, no bytes repr
    assert not [w for w in warnings if "NaN" in w or "b'" in w], warnings


def test_a_negative_counter_after_a_value_that_is_no_number_is_named_at_its_own_line(tmp_path, base_lines,
                                                                                      clean_findings):
    lines = list(base_lines)
    at = series_lines(lines, TX)
    key, _, ts = lines[at[9]].rsplit(" ", 2)
    lines[at[9]] = f"{key} 12x4 {ts}"
    key, _, ts = lines[at[14]].rsplit(" ", 2)
    lines[at[14]] = f"{key} -5 {ts}"
    trace = write(tmp_path / "two.om.gz", lines)
    recovered(diagnose("--replay", str(trace), "--format", "json"), clean_findings,
              f"{trace}:{at[9] + 1}: not a number", f"1 samples with a NaN, infinite, negative or impossible (over "
              f"1e21) value or timestamp dropped (the first at line {at[14] + 1})")


def test_a_line_of_four_fields_is_named_as_such_not_as_unterminated_labels(tmp_path, base_lines, clean_findings):
    lines = list(base_lines)
    at = series_lines(lines, TX)[9]
    value = lines[at].rsplit(" ", 2)[1]
    lines[at] += " 7"
    trace = write(tmp_path / "four.om.gz", lines)
    warnings = recovered(diagnose("--replay", str(trace), "--format", "json"), clean_findings, f"{trace}:{at + 1}:")
    assert any(f"text after the label set: '{value}' (a field too many?)" in w for w in warnings), warnings
    assert not [w for w in warnings if "unterminated" in w or "b'" in w], warnings


def test_a_sample_without_a_metric_name_is_named_as_such(tmp_path, base_lines, clean_findings):
    lines = list(base_lines)
    at = series_lines(lines, TX)[9]
    lines[at] = lines[at][len(TX):]
    trace = write(tmp_path / "noname.om.gz", lines)
    recovered(diagnose("--replay", str(trace), "--format", "json"), clean_findings,
              f"a sample without a metric name (line {at + 1})")


def test_a_last_line_cut_short_is_skipped_with_a_warning(tmp_path, base_lines, clean_findings):
    lines = [line for line in base_lines if line and line != "# EOF"]
    trace = tmp_path / "cut.om"
    trace.write_text("\n".join(lines) + "\n" + lines[-1][: len(lines[-1]) // 2])
    recovered(diagnose("--replay", str(trace), "--format", "json"), clean_findings, "middle of a line")


@pytest.mark.parametrize("sample", ['{device="ens1f0np0",instance=node-001:9845"} 1 1767225617',
                                    '{device="ens1f0np0" 1 1767225617',
                                    '{device="a b",instance="node-001:9845"} 1'])  # no timestamp: splits wrong
def test_malformed_labels_skip_their_series_with_a_warning(tmp_path, base_lines, clean_findings, sample):
    lines = list(base_lines)
    at = series_lines(lines, TX)[-1] + 1  # a new series right after node-001's first
    lines.insert(at, TX + sample)
    trace = write(tmp_path / "labels.om.gz", lines)
    recovered(diagnose("--replay", str(trace), "--format", "json"), clean_findings, f"{trace}:{at + 1}:")


@pytest.mark.parametrize("line", [b"# TYPE", b"# TYPE \xff\xfe counter"])
def test_broken_type_line_is_no_traceback(tmp_path, base_lines, line):
    data = "\n".join(base_lines).encode()
    trace = tmp_path / "type.om"
    trace.write_bytes(line + b"\n" + data)
    result = diagnose("--replay", str(trace), "--format", "json")
    clean_stderr(result)
    assert result.returncode in (0, 1), result.stderr
    if result.returncode == 1:
        assert f"{trace}:1:" in result.stderr


def test_many_damaged_series_warnings_are_bounded(tmp_path, base_lines):
    lines = []
    for line in base_lines:
        if line.startswith("gpunet_nic_") and "_total{" in line and line.endswith("7"):
            key, _, ts = line.rsplit(" ", 2)
            line = f"{key} -1 {ts}"
        lines.append(line)
    trace = write(tmp_path / "manybad.om.gz", lines)
    result = diagnose("--replay", str(trace), "--format", "json")
    clean_stderr(result)
    assert result.returncode == 0 and "findings" in json.loads(result.stdout)
    warnings = result.stderr.splitlines()
    assert len(warnings) <= 6 and "more series with" in warnings[-1], result.stderr


def test_hundreds_of_thousands_of_junk_devices_bounded_memory(tmp_path, base_lines, clean_findings):
    """300k series of a name the diagnoser reads, each a NIC never seen before: one row
    per NIC in the frame would take gigabytes; NICs past a plausible count are dropped."""
    lines = list(base_lines)
    ts = lines[-3].rsplit(" ", 1)[1]
    at = next(i for i, l in enumerate(lines) if l.startswith("# TYPE gpunet_nic_up")) + 2
    lines[at:at] = [f'gpunet_nic_up{{device="junk{i}",instance="node-{i % 12 + 1:03d}:9845",job="gpunet"}} 1 {ts}'
                    for i in range(300_000)]
    trace = write(tmp_path / "devices.om.gz", lines)
    rss = tmp_path / "rss"
    result = diagnose("--replay", str(trace), "--format", "json", rss_file=rss)
    recovered(result, clean_findings, "over 256 devices on one instance")
    peak_mb = int(rss.read_text().split()[-1]) / 1024
    assert peak_mb < 600, peak_mb


def test_millisecond_timestamps_are_named_not_read_as_year_57971(tmp_path, base_lines):
    """A trace written with milliseconds (Prometheus' own text format) where seconds belong."""
    lines = [l if not l.startswith("gpunet") else l.rsplit(" ", 1)[0] + " " + str(round(float(l.rsplit(" ", 1)[1]) * 1000))
             for l in base_lines]
    trace = write(tmp_path / "ms.om.gz", lines)
    last = fatal(diagnose("--replay", str(trace)), f"{trace}:")
    assert "not Unix seconds" in last and "milliseconds" in last


def test_one_node_in_milliseconds_is_read_as_such_and_named(tmp_path, base_lines, clean_findings):
    """One node's recorder wrote milliseconds, the others seconds: that node's series are read
    as milliseconds (their times fall in the others' span once divided by 1000), with a
    warning naming the instance, and the findings are those of the clean trace. A series whose
    times are neither is left out, and named."""
    node = 'instance="node-003:9845"'

    def in_ms(line: str) -> str:
        head, value, ts = line.rsplit(" ", 2)
        return f"{head} {value} {round(float(ts) * 1000)}"

    lines = [in_ms(l) if l.startswith("gpunet") and node in l else l for l in base_lines]
    junk = series_lines(lines, TX, "node-005:9845")
    for i in junk:  # a clock off by a factor no unit explains
        head, value, ts = lines[i].rsplit(" ", 2)
        lines[i] = f"{head} {value} {round(float(ts) * 1e6)}"
    result = diagnose("--replay", str(write(tmp_path / "one-node-ms.om.gz", lines)), "--format", "json")
    warnings = recovered(result, clean_findings, "in milliseconds", "node-003:9845", "left out")
    assert any("node-005:9845" in w and "left out" in w for w in warnings), warnings


@pytest.mark.parametrize("flag,value", [("--end", "nan"), ("--start", "inf"), ("--end", "1767225617000"),
                                        ("--since", "0s"), ("--since", "nan")])
def test_a_time_or_duration_that_cannot_be_is_a_usage_error(flag, value):
    result = diagnose("--replay", str(BASE), flag, value)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"diagnose: {flag}:"), line


def test_since_and_start_together_are_a_usage_error():
    """One of them would be ignored: the window would not be the one asked for."""
    result = diagnose("--replay", str(BASE), "--start", "2026-01-01T00:05:00Z", "--since", "5m")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("diagnose: --since:") and "not both" in line, line


def test_html_into_a_folder_that_does_not_exist_fails_before_the_analysis(tmp_path):
    page = tmp_path / "no" / "such" / "report.html"
    result = diagnose("--replay", str(BASE), "--html", str(page))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "--html" in result.stderr and str(page.parent) in result.stderr and not result.stdout


def test_gpunet_trace_load_of_a_truncated_gzip_is_one_line(tmp_path):
    cut = tmp_path / "cut.om.gz"
    cut.write_bytes(BASE.read_bytes()[:100_000])
    result = subprocess.run([sys.executable, "-m", "gpunet.trace_cli", "load", str(cut), "--data",
                             str(tmp_path / "tsdb")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("gpunet-trace:") and str(cut) in line


# ---- several damaged lines at once; pipes; control characters ----

def test_five_damaged_lines_together_at_a_series_start_are_each_skipped(tmp_path, base_lines, clean_findings):
    """A series' first samples each damaged (a value that is no number, labels cut, again,
    no timestamp): the series' first blocks hold no sample at all, and come twice."""
    lines = list(base_lines)
    at = series_lines(lines, TX, "node-006:9845")[:5]
    for i, how in zip(at, ("number", "labels", "number", "labels", "timestamp")):
        key, value, ts = lines[i].rsplit(" ", 2)
        cut = key.replace('instance="', "instance=", 1)
        lines[i] = {"number": f"{key} 12x4 {ts}", "labels": f"{cut} {value} {ts}", "timestamp": f"{key} {value}"}[how]
    trace = write(tmp_path / "five.om.gz", lines)
    recovered(diagnose("--replay", str(trace), "--format", "json"), clean_findings, f"{trace}:{at[0] + 1}: not a number",
              "malformed labels")


@pytest.mark.parametrize("cat", ["cat", "zcat"])
def test_a_trace_through_a_pipe_reads_as_the_file_does(cat, clean_findings):
    """`--replay <(cat x.om.gz)`: gzip told by its first bytes, the pipe read once, front to back."""
    result = subprocess.run(["bash", "-c", f'"$0" -m diagnoser.cli --replay <({cat} "$1") --format json',
                             sys.executable, str(BASE)], cwd=REPO, capture_output=True, text=True, timeout=120)
    clean_stderr(result)
    assert result.returncode == 0 and summary(result) == clean_findings, result.stderr
    assert "warning" not in result.stderr, result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_gpunet_trace_load_reads_a_gzip_trace_through_a_pipe(tmp_path):
    data = tmp_path / "tsdb"
    result = subprocess.run(["bash", "-c", '"$0" -m gpunet.trace_cli load <(cat "$1") --data "$2"', sys.executable,
                             str(BASE), str(data)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "loaded" in result.stderr and "(2026-01-01T00:00:00Z .. 2026-01-01T00:29:56Z)" in result.stderr, result.stderr


def test_control_characters_of_a_damaged_line_are_escaped_in_warnings_and_reports(tmp_path, base_lines,
                                                                                    clean_findings):
    """ESC, BEL and BS in a damaged line and in a label value: shown escaped on stderr, in
    the text report and in the HTML page, never sent to the terminal or the browser raw."""
    lines = list(base_lines)
    at = series_lines(lines, TX)[9]
    key, _, ts = lines[at].rsplit(" ", 2)
    lines[at] = f"{key} \x1b[2J\x07\x08 {ts}"  # clear the screen, ring, back up
    negative = series_lines(lines, TX, "node-011:9845")[9]  # the culprit's: warned about with its labels
    key, _, ts = lines[negative].rsplit(" ", 2)
    lines[negative] = f"{key} -5 {ts}"
    lines = [l.replace('instance="node-011:9845"', 'instance="node-011\x1b]0;owned\x07:9845"') for l in lines]
    trace = write(tmp_path / "ctl.om.gz", lines)
    page = tmp_path / "report.html"
    result = diagnose("--replay", str(trace), "--html", str(page))
    assert result.returncode == 0, result.stderr
    for where, text in (("stderr", result.stderr), ("text report", result.stdout),
                        ("html", page.read_text(encoding="utf-8"))):
        assert not set(text) & {"\x1b", "\x07", "\x08"}, where
    assert f"{trace}:{at + 1}: not a number: value '\\x1b[2J\\x07\\x08'" in result.stderr, result.stderr
    escaped = "node-011\\x1b]0;owned\\x07:9845"
    assert escaped in result.stderr and escaped in result.stdout and escaped in page.read_text(encoding="utf-8")


# ---- any damage, anywhere, several lines at once (Hypothesis) ----

def _damaged(line: str, kind: int, junk: str) -> str:
    key, _, rest = line.partition(" ")
    value, _, ts = rest.partition(" ")
    return [f"{key} {value}", key.replace('="', "=", 1) + " " + rest, f"{key} {junk} {ts}", f"{line} {junk}",
            key[key.find("{"):] + " " + rest, f"{key} NaN {ts}", f"{key} -5 {ts}", f"{key} {value} {junk}",
            f'{key[:-3]}{junk}"}} {rest}', line[:len(line) // 2], "", junk, f"{key} {value} 1e30", line + line][kind]


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory, base_lines):
    """The committed trace's first three nodes: a second to read, so that many examples run."""
    keep = ("node-001:", "node-002:", "node-003:")
    return [l for l in base_lines if not l or l.startswith("#") or any(f'instance="{n}' in l for n in keep)]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), junk=st.sampled_from(["abc", "nan", "\x1b[31m", "", "x y", "1e999", "-1", '"', "{}"]))
def test_the_reader_survives_several_damaged_lines_at_once(small_trace, data, junk):
    """Up to three places, each of up to eight consecutive sample lines damaged in any of
    fourteen ways (a series' first lines among the places): read, or refused with a
    TraceError naming the file, never another error."""
    from diagnoser.sources import replay

    lines = list(small_trace)
    samples = [i for i, l in enumerate(lines) if l and not l.startswith("#")]
    starts = [k for k in range(len(samples)) if k == 0 or lines[samples[k]].rsplit(" ", 2)[0]
              != lines[samples[k - 1]].rsplit(" ", 2)[0]]
    for _ in range(data.draw(st.integers(1, 3))):
        first = data.draw(st.sampled_from(starts) | st.integers(0, len(samples) - 9))
        kinds = data.draw(st.lists(st.integers(0, 13), min_size=2, max_size=8))
        for k, kind in enumerate(kinds):
            i = samples[first + k]
            lines[i] = _damaged(lines[i], kind, junk)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.om"
        path.write_text("\n".join(lines), encoding="utf-8")
        try:
            trace = replay.read(path)
        except replay.TraceError as e:
            assert str(path) in str(e)
        else:
            assert trace.series and trace.first <= trace.last
