"""Generate the Grafana dashboards in this folder from plain dicts.

    python dashboards/build.py            # rewrite dashboards/*.json
    python dashboards/build.py --check    # exit 1 if a committed file differs

The JSON files are what users import (Grafana 10 and 11: Dashboards > New > Import, pick
the Prometheus data source). Output is deterministic: same code, same bytes.
tests/test_dashboards.py checks that the committed JSON equals this generator's output
and evaluates every panel's PromQL against real Prometheus servers loaded with the
committed replay traces.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"

# Label matchers every panel uses. Multi-value "All" variables expand to a regex (allValue .*).
NODE = 'cluster=~"$cluster", job=~"$job", instance=~"$instance"'
NIC = NODE + ', device=~"$device"'
GPU = NODE + ', gpu=~"$gpu"'


def nic_util(sel: str = NIC) -> str:
    """Per NIC, the busier direction's wire throughput as a fraction of link speed."""
    return ("max by (instance, device) ("
            f'label_replace(rate(gpunet_nic_transmit_bytes_total{{{sel}}}[{RI}]), "direction", "transmit", "", "")'
            f' or label_replace(rate(gpunet_nic_receive_bytes_total{{{sel}}}[{RI}]), "direction", "receive", "", "")'
            ") / on (instance, device) group_left () "
            f"max by (instance, device) (gpunet_nic_link_speed_bytes_per_second{{{sel}}} > 0)")


def fabric_speed(sel: str = NIC) -> str:
    """Link speed of the training-fabric NICs (those with an RDMA device)."""
    return (f"(max by (instance, device) (gpunet_nic_link_speed_bytes_per_second{{{sel}}})"
            f' * on (instance, device) group_left () max by (instance, device) (gpunet_nic_info{{{sel}, rdma_device!=""}}))')


GPUS = f"count(gpunet_gpu_busy_seconds_total{{{GPU}}})"


# --- panel builders -------------------------------------------------------------------

def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict:
    t = {"datasource": DS, "editorMode": "code", "expr": expr, "legendFormat": legend or "__auto",
         "range": not instant, "instant": instant, "refId": ref}
    if fmt != "time_series":
        t["format"] = fmt
    return t


def targets(*specs) -> list[dict]:
    """specs: (expr, legend) pairs; refIds A, B, C, ..."""
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(specs)]


def timeseries(title: str, tgts: list[dict], unit: str = "short", desc: str = "", stack: bool = False,
               w: int = 12, h: int = 8, fill: int | None = None, minimum: float | None = 0,
               maximum: float | None = None, draw: str = "line", legend_calcs: list[str] | None = None) -> dict:
    defaults = {"unit": unit, "custom": {"drawStyle": draw, "lineWidth": 1,
                                         "fillOpacity": fill if fill is not None else (70 if stack else 10),
                                         "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                                         "showPoints": "never", "spanNulls": False}}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {"type": "timeseries", "title": title, "description": desc, "datasource": DS, "targets": tgts,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "table" if legend_calcs else "list", "placement": "bottom",
                                   "showLegend": True, "calcs": legend_calcs or []},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "_w": w, "_h": h}


def bargauge(title: str, expr: str, legend: str, unit: str = "short", desc: str = "", w: int = 8, h: int = 8,
             maximum: float | None = None) -> dict:
    defaults = {"unit": unit, "min": 0, "color": {"mode": "continuous-GrYlRd"}}
    if maximum is not None:
        defaults["max"] = maximum
    return {"type": "bargauge", "title": title, "description": desc, "datasource": DS,
            "targets": [target(expr, legend, instant=True)],
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "minVizHeight": 10, "minVizWidth": 0, "valueMode": "color", "namePlacement": "auto",
                        "sizing": "auto"},
            "_w": w, "_h": h}


def stat(title: str, expr: str, unit: str = "short", desc: str = "", w: int = 6, h: int = 4,
         thresholds: list[tuple[float | None, str]] | None = None) -> dict:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    return {"type": "stat", "title": title, "description": desc, "datasource": DS,
            "targets": [target(expr, "", instant=False)],
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps},
                                         "color": {"mode": "thresholds"}}, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "background", "graphMode": "area", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "auto"},
            "_w": w, "_h": h}


def table(title: str, tgts: list[dict], desc: str = "", w: int = 12, h: int = 8,
          columns: dict[str, str] | None = None) -> dict:
    """A table of instant queries. With `columns` ({refId: column name}), the queries' values
    become columns of one row per label set (Grafana's merge), e.g. one row per NIC."""
    transformations = [{"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True, "job": True},
                                                      "renameByName": {f"Value #{ref}": name
                                                                       for ref, name in (columns or {}).items()}}}]
    if columns:
        transformations.insert(0, {"id": "merge", "options": {}})
    return {"type": "table", "title": title, "description": desc, "datasource": DS, "targets": tgts,
            "fieldConfig": {"defaults": {"unit": "none"}, "overrides": []},
            "options": {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
            "transformations": transformations, "_w": w, "_h": h}


def pcie_columns(kind: str, sel: str) -> list[tuple[str, str]]:
    """The PCIe link of a NIC or GPU (kind), trained against supported, as table columns."""
    return [("PCIe GT/s", f"gpunet_{kind}_pcie_current_link_transfers_per_second{{{sel}}} / 1e9"),
            ("PCIe max GT/s", f"gpunet_{kind}_pcie_max_link_transfers_per_second{{{sel}}} / 1e9"),
            ("lanes", f"gpunet_{kind}_pcie_current_link_width{{{sel}}}"),
            ("max lanes", f"gpunet_{kind}_pcie_max_link_width{{{sel}}}")]


def columns_table(title: str, specs: list[tuple[str, str]], desc: str = "", w: int = 12, h: int = 8) -> dict:
    """specs: (column name, instant expr) -> one row per label set, one column per expr."""
    refs = [chr(ord("A") + i) for i in range(len(specs))]
    return table(title, [target(expr, "", ref, instant=True, fmt="table") for ref, (_, expr) in zip(refs, specs)],
                 desc, w, h, columns={ref: name for ref, (name, _) in zip(refs, specs)})


def heatmap(title: str, tgts: list[dict], desc: str = "", w: int = 24, h: int = 10) -> dict:
    """One row per series (node/NIC), colour = value: Grafana's heatmap with calculate off."""
    return {"type": "heatmap", "title": title, "description": desc, "datasource": DS, "targets": tgts,
            "fieldConfig": {"defaults": {"unit": "percentunit", "custom": {"scaleDistribution": {"type": "linear"}}},
                            "overrides": []},
            "options": {"calculate": False, "cellGap": 1,
                        "color": {"mode": "scheme", "scheme": "Turbo", "steps": 64, "exponent": 0.5,
                                  "fill": "dark-orange", "reverse": False, "scale": "exponential",
                                  "min": 0, "max": 1},
                        "yAxis": {"axisPlacement": "left", "reverse": True, "unit": "none"},
                        "rowsFrame": {"layout": "auto"}, "cellValues": {"unit": "percentunit"},
                        "legend": {"show": True}, "tooltip": {"mode": "single", "yHistogram": False},
                        "showValue": "never", "filterValues": {"le": 1e-9}},
            "_w": w, "_h": h}


def state_timeline(title: str, tgts: list[dict], desc: str = "", w: int = 12, h: int = 8,
                   mappings: list[dict] | None = None) -> dict:
    return {"type": "state-timeline", "title": title, "description": desc, "datasource": DS, "targets": tgts,
            "fieldConfig": {"defaults": {"unit": "none", "mappings": mappings or [],
                                         "color": {"mode": "thresholds"},
                                         "thresholds": {"mode": "absolute",
                                                        "steps": [{"color": "red", "value": None},
                                                                  {"color": "green", "value": 1}]}},
                            "overrides": []},
            "options": {"showValue": "never", "mergeValues": True, "rowHeight": 0.9,
                        "legend": {"showLegend": False}},
            "_w": w, "_h": h}


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_w": 24, "_h": 1}


UP_MAPPING = [{"type": "value", "options": {"0": {"text": "down", "color": "red"},
                                            "1": {"text": "up", "color": "green"}}}]


# --- variables ------------------------------------------------------------------------

def query_var(name: str, label: str, query: str, multi: bool = True) -> dict:
    return {"type": "query", "name": name, "label": label, "datasource": DS,
            "query": query,  # the string form: Grafana 10 and 11 both read it
            "refresh": 2, "regex": "", "sort": 3 if name == "gpu" else 1,
            "multi": multi, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [],
            "hide": 0, "skipUrlSync": False}


def variables(one_node: bool = False) -> list[dict]:
    """The data source, then cluster > job > node > NIC/GPU. `cluster` is the target label
    that tells clusters apart (empty where there is none: "All" then matches every series).
    `one_node`: the node drill-down opens on one node, not on all of them at once."""
    node = query_var("instance", "Node", 'label_values(gpunet_nic_info{cluster=~"$cluster", job=~"$job"}, instance)',
                     multi=not one_node)
    if one_node:
        node.update(includeAll=False)
        del node["current"]  # Grafana selects the first node
    return [
        {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
         "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
         "regex": "", "skipUrlSync": False},
        query_var("cluster", "Cluster", "label_values(gpunet_exporter_collector_up, cluster)"),
        query_var("job", "Job", 'label_values(gpunet_exporter_collector_up{cluster=~"$cluster"}, job)'),
        node,
        query_var("device", "NIC", f'label_values(gpunet_nic_info{{{NODE}}}, device)'),
        query_var("gpu", "GPU", f'label_values(gpunet_gpu_info{{{NODE}}}, gpu)'),
    ]


def layout(panels: list[dict]) -> list[dict]:
    """Place panels left to right, wrapping at Grafana's 24 columns; number them."""
    x = y = row_h = 0
    out = []
    for i, p in enumerate(panels, 1):
        w, h = p.pop("_w"), p.pop("_h")
        if x + w > 24 or p["type"] == "row":
            x, y, row_h = 0, y + row_h, 0
        p = {"id": i, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **p}
        if p["type"] == "row":
            p.pop("datasource", None)
        out.append(p)
        x += w
        row_h = max(row_h, h)
        if p["type"] == "row":
            x, y, row_h = 0, y + h, 0
    return out


# Every panel that shows nodes links each of them to the node drill-down, with the time range.
NODE_LINK = {"title": "${__field.labels.instance} in the node drill-down", "targetBlank": False,
             "url": "/d/gpunet-node?var-cluster=${cluster}&var-job=${job}&var-instance=${__field.labels.instance}"
                    "&${__url_time_range}"}
TABLE_NODE_LINK = {**NODE_LINK, "title": "${__value.raw} in the node drill-down",
                   "url": NODE_LINK["url"].replace("${__field.labels.instance}", "${__value.raw}")}
# gpunet's firing alerts (alerts/gpunet.rules.yml) on every time series, red.
ALERT_ANNOTATION = {"datasource": DS, "enable": True, "hide": False, "iconColor": "red", "name": "gpunet alerts",
                    "target": {"refId": "gpunet-alerts", "expr": 'ALERTS{alertname=~"Gpunet.*", alertstate="firing", '
                                                                 'instance=~"$instance"}',
                               "step": "1m", "titleFormat": "{{alertname}} ({{severity}})",
                               "textFormat": "{{instance}} {{device}}{{gpu}}", "tagKeys": "severity",
                               "useValueForTime": False}}
# Each ongoing finding of the diagnoser service (`diagnose serve`, docs/service.md), on the nodes
# it names as culprits: the cause beside the symptoms the panels show.
DIAGNOSIS_ANNOTATION = {"datasource": DS, "enable": True, "hide": False, "iconColor": "purple",
                        "name": "gpunet diagnoses",
                        "target": {"refId": "gpunet-diagnoses",
                                   "expr": 'gpunet_diagnosis_finding{culprit=~"$instance"}',
                                   "step": "1m", "titleFormat": "{{class}} (diagnosis)",
                                   "textFormat": "{{workload}}: {{culprit}} {{device}}", "tagKeys": "class,workload",
                                   "useValueForTime": False}}


def link_nodes(panel: dict) -> dict:
    """Data links from a panel's nodes to the node drill-down: per series where the series
    are nodes, on the `instance` column of a table."""
    if panel["type"] in ("timeseries", "bargauge") and any(
            "{{instance}}" in t.get("legendFormat", "") for t in panel.get("targets", [])):
        panel["fieldConfig"]["defaults"]["links"] = [NODE_LINK]
    elif panel["type"] == "table":
        panel["fieldConfig"]["overrides"].append({"matcher": {"id": "byName", "options": "instance"},
                                                  "properties": [{"id": "links", "value": [TABLE_NODE_LINK]}]})
    return panel


def dashboard(uid: str, title: str, description: str, panels: list[dict], tags: list[str],
              links: bool = True) -> dict:
    one_node = uid == "gpunet-node"
    if not one_node:
        panels = [link_nodes(p) for p in panels]
    d = {
        "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
                       {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}],
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"},
                                 ALERT_ANNOTATION, DIAGNOSIS_ANNOTATION]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"asDropdown": False, "includeVars": True, "keepTime": True, "tags": ["gpunet"],
                   "title": "gpunet dashboards", "type": "dashboards", "icon": "external link", "targetBlank": False,
                   "tooltip": "", "url": ""}] if links else [],
        "panels": layout(panels),
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": tags,
        "templating": {"list": variables(one_node)},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }
    return d


# --- the dashboards -------------------------------------------------------------------

def cluster() -> dict:
    idle_state = (f"sum by (network_state) (rate(gpunet_gpu_idle_seconds_total{{{GPU}}}[{RI}]))"
                  f" / on () group_left () {GPUS}")
    busy = f"sum(rate(gpunet_gpu_busy_seconds_total{{{GPU}}}[{RI}])) / {GPUS}"
    node_idle = (f"sum by (instance) (rate(gpunet_gpu_idle_seconds_total{{{GPU}}}[$__range]))"
                 f" / count by (instance) (gpunet_gpu_busy_seconds_total{{{GPU}}})")
    pauses = "gpunet_nic_pfc_pause_frames_total"
    panels = [
        stat("GPU idle", f"sum(rate(gpunet_gpu_idle_seconds_total{{{GPU}}}[{RI}])) / {GPUS}", "percentunit",
             "Fraction of GPU time no kernel ran, all selected GPUs.",
             thresholds=[(None, "green"), (0.2, "orange"), (0.4, "red")]),
        stat("GPU idle while network saturated or paused",
             f'sum(rate(gpunet_gpu_idle_seconds_total{{{GPU}, network_state=~"saturated|paused"}}[{RI}])) / {GPUS}',
             "percentunit", "GPU time waiting while the node's fabric NICs ran at line rate or were paused.",
             thresholds=[(None, "green"), (0.1, "orange"), (0.25, "red")]),
        stat("Nodes transmitting PFC pauses",
             f'count(sum by (instance) (rate({pauses}{{{NIC}, direction="transmit"}}[{RI}])) > 1) or vector(0)',
             "short", "Nodes whose NICs send pause frames (more than 1/s): PFC storm suspects.",
             thresholds=[(None, "green"), (1, "red")]),
        stat("NICs down", f"count(gpunet_nic_up{{{NIC}}} == 0) or vector(0)", "short",
             "NIC ports whose operstate is down or carrier lost.", thresholds=[(None, "green"), (1, "red")]),

        row("GPU time"),
        timeseries("GPU idle fraction by network state",
                   targets((idle_state, "idle, {{network_state}}")), "percentunit",
                   "Share of GPU time idle, split by what the node's training fabric did in the same fast tick: "
                   "quiet (host-bound), active, saturated (links too slow), paused (PFC). Stacked; the top edge is "
                   "the total idle fraction.", stack=True, w=12, h=9, maximum=1),
        timeseries("GPU busy fraction", targets((busy, "busy")), "percentunit",
                   "Share of GPU time in which a kernel ran.", w=6, h=9, maximum=1),
        bargauge("Top nodes by GPU idle (time range)", f"topk(10, {node_idle})", "{{instance}}", "percentunit",
                 "Nodes whose GPUs idled most over the dashboard's time range.", w=6, h=9, maximum=1),

        row("Network"),
        heatmap("NIC utilisation vs link speed, across nodes",
                [target(nic_util(), "{{instance}} {{device}}")],
                "Per NIC, the busier direction's wire throughput / negotiated link speed (1 = line rate). "
                "A bandwidth-bound job is bright everywhere; a PFC storm or loss collapses the whole row set; one "
                "dark or saturated row is a local problem."),
        timeseries("PFC pause frames by direction",
                   targets((f"sum by (direction) (rate({pauses}{{{NIC}}}[{RI}]))", "{{direction}}")),
                   "pps", "Pause frames per second, all nodes. Transmitted pauses come from a congested or "
                   "stuck receiver; received pauses are what it does to its peers.", w=8),
        timeseries("Top nodes by transmitted PFC pauses",
                   targets((f'sum by (instance) (rate({pauses}{{{NIC}, direction="transmit"}}[{RI}]))'
                            f' and on (instance) topk(5, sum by (instance) '
                            f'(increase({pauses}{{{NIC}, direction="transmit"}}[$__range] @ end())))',
                            "{{instance}}")),
                   "pps", "The 5 nodes that transmitted the most pause frames over the time range, over time. A node "
                   "that transmits pauses continuously while its peers receive them is a PFC storm source.", w=8),
        bargauge("Top nodes by transmitted PFC pauses (time range)",
                 f'topk(10, sum by (instance) (increase({pauses}{{{NIC}, direction="transmit"}}[$__range])))',
                 "{{instance}}", "short", "Pause frames transmitted over the dashboard's time range.", w=8),
        timeseries("ECN marks and CNPs",
                   targets((f"sum(rate(gpunet_nic_ecn_marked_packets_total{{{NIC}}}[{RI}]))", "ECN-marked packets"),
                           (f"sum(rate(gpunet_nic_cnp_sent_total{{{NIC}}}[{RI}]))", "CNPs sent"),
                           (f"sum(rate(gpunet_nic_cnp_received_total{{{NIC}}}[{RI}]))", "CNPs received")),
                   "pps", "DCQCN congestion signals. A steady background is normal on RoCE; a jump with falling "
                   "throughput is congestion.", w=8),
        timeseries("RDMA loss events by kind",
                   targets((f"sum by (kind) (rate(gpunet_nic_rdma_loss_events_total{{{NIC}}}[{RI}]))", "{{kind}}")),
                   "cps", "Go-back-N triggers per second: out-of-sequence, NAK sequence errors, ACK timeouts.",
                   w=8),
        timeseries("TCP retransmit ratio by node",
                   targets((f"sum by (instance) (rate(gpunet_tcp_retransmitted_segments_total{{{NODE}}}[{RI}]))"
                            f" / sum by (instance) (rate(gpunet_tcp_sent_segments_total{{{NODE}}}[{RI}]) > 0)",
                            "{{instance}}")),
                   "percentunit", "Retransmitted / sent TCP segments (NCCL over sockets, storage).", w=8),

        row("Links"),
        table("Links down",
              [target(f"gpunet_nic_up{{{NIC}}} == 0", "", instant=True, fmt="table")],
              "NIC ports down now (value 0).", w=8),
        table("Fabric links slower than the median",
              [target(f"{fabric_speed()} < on () group_left () quantile(0.5, {fabric_speed()})", "",
                      instant=True, fmt="table")],
              "Training-fabric NICs whose negotiated speed (bytes/s) is below the cluster median: "
              "a downshifted port.", w=8),
        timeseries("Link flaps",
                   targets((f"sum by (instance, device) (increase(gpunet_nic_carrier_changes_total{{{NIC}}}[{RI}]))"
                            " > 0", "{{instance}} {{device}}")),
                   "short", "Carrier changes per rate interval, ports that flapped only.", w=8, draw="bars"),
        timeseries("NIC up", targets((f"sum(gpunet_nic_up{{{NIC}}})", "up"),
                                     (f"count(gpunet_nic_up{{{NIC}}})", "ports")),
                   "short", "Ports up against ports known.", w=12, h=6),
        timeseries("Fabric link speed (min / median / max)",
                   targets((f"min({fabric_speed()})", "min"), (f"quantile(0.5, {fabric_speed()})", "median"),
                           (f"max({fabric_speed()})", "max")),
                   "Bps", "A gap between min and median is a port that negotiated below its peers.", w=12, h=6),

        row("Workloads"),
        columns_table("Workloads: GPUs and where their time went (time range)", [
            ("GPUs", f"count by (workload) (gpunet_gpu_workload_info{{{GPU}}})"),
            ("nodes", f"count by (workload) (count by (workload, instance) (gpunet_gpu_workload_info{{{GPU}}}))"),
            # The idle time is summed by GPU before the join: target labels that change at an exporter
            # restart (a Kubernetes pod) would otherwise give two series per GPU for the lookback.
            ("GPU idle", f"sum by (workload) (gpunet_gpu_workload_info{{{GPU}}} * on (cluster, job, instance, gpu) "
                         f"group_left () sum by (cluster, job, instance, gpu) "
                         f"(rate(gpunet_gpu_idle_seconds_total{{{GPU}}}[$__range])))"
                         f" / count by (workload) (gpunet_gpu_workload_info{{{GPU}}})"),
            ("idle, network saturated or paused",
             f"sum by (workload) (gpunet_gpu_workload_info{{{GPU}}} * on (cluster, job, instance, gpu) "
             f"group_left () sum by (cluster, job, instance, gpu) (rate(gpunet_gpu_idle_seconds_total{{{GPU}, "
             f'network_state=~"saturated|paused"}}[$__range])))'
             f" / count by (workload) (gpunet_gpu_workload_info{{{GPU}}})")],
            "Each workload (gpunet_gpu_workload_info: Kubernetes job, Slurm job, or process) with its GPUs and "
            "nodes, and the share of its GPU time spent idle over the time range, in all and while the "
            "network was saturated or paused. `diagnose` compares nodes only within one job.", w=24, h=7),

        row("Configuration"),
        stat("NICs with PFC but no ECN",
             f"count(count by (instance, device) ((gpunet_nic_pfc_enabled{{{NIC}}} == 1) and on (instance, device, "
             f"priority) (min without (point) (gpunet_nic_ecn_enabled{{{NIC}}}) == 0))) or vector(0)", "short",
             "NICs with PFC on a priority whose RoCE congestion control (ECN/DCQCN) is off: pauses are the only "
             "brake. `diagnose --audit` names them.", thresholds=[(None, "green"), (1, "red")]),
        stat("PCIe links below capability",
             f"count((gpunet_nic_pcie_max_link_width{{{NIC}}} - gpunet_nic_pcie_current_link_width{{{NIC}}} > 0) or "
             f"(gpunet_nic_pcie_max_link_transfers_per_second{{{NIC}}} - "
             f"gpunet_nic_pcie_current_link_transfers_per_second{{{NIC}}} > 0) or "
             f"(gpunet_gpu_pcie_max_link_width{{{GPU}}} - gpunet_gpu_pcie_current_link_width{{{GPU}}} > 0)) or vector(0)",
             "short", "NICs trained below their PCIe width or rate, GPUs below their width (a GPU lowers its "
             "rate when idle, by design).", thresholds=[(None, "green"), (1, "orange")]),
        stat("Fabric MTUs in use",
             f'count(count by (mtu) (count_values without (instance, device) ("mtu", gpunet_nic_mtu_bytes{{{NIC}}} '
             f'and on (instance, device) gpunet_nic_info{{{NIC}, rdma_device!=""}})))', "short",
             "Distinct MTUs on the fabric NICs: more than one is a mismatch somewhere.",
             thresholds=[(None, "green"), (2, "orange")]),
        stat("Fabric link speeds in use",
             f'count(count by (speed) (count_values without (instance, device) ("speed", {fabric_speed()})))',
             "short", "Distinct negotiated speeds of the fabric NICs: more than one means some run below their "
             "peers.", thresholds=[(None, "green"), (2, "orange")]),

        row("GPU throttling"),
        timeseries("GPUs throttled, by reason",
                   targets((f"sum by (reason) (rate(gpunet_gpu_throttled_seconds_total{{{GPU}}}[{RI}]))",
                            "{{reason}}")),
                   "short", "GPU-seconds per second during which an NVML clock-event reason slowed the GPU "
                   "(= number of GPUs throttled).", stack=True, w=12),
        bargauge("Top nodes by throttled GPUs (time range)",
                 f"topk(10, sum by (instance) (rate(gpunet_gpu_throttled_seconds_total{{{GPU}}}[$__range])))",
                 "{{instance}}", "short", "Average number of throttled GPUs per node over the time range.", w=12),
    ]
    return dashboard("gpunet-cluster", "gpunet / Cluster overview",
                     "Are the GPUs waiting on the network, and why: idle by network state, utilisation, congestion, "
                     "PFC, loss, links, throttling.", panels, ["gpunet", "gpu", "network"])


def node() -> dict:
    pauses = "gpunet_nic_pfc_pause_frames_total"
    panels = [
        row("NICs"),
        timeseries("Wire throughput vs link speed",
                   targets((f"rate(gpunet_nic_transmit_bytes_total{{{NIC}}}[{RI}])", "{{instance}} {{device}} tx"),
                           (f"rate(gpunet_nic_receive_bytes_total{{{NIC}}}[{RI}])", "{{instance}} {{device}} rx"),
                           (f"gpunet_nic_link_speed_bytes_per_second{{{NIC}}}", "{{instance}} {{device}} link speed")),
                   "Bps", "Bytes on the wire (RDMA included) per direction, with the negotiated link speed.", w=12),
        timeseries("Utilisation (busier direction / link speed)", targets((nic_util(), "{{instance}} {{device}}")),
                   "percentunit", "The busier direction of each NIC as a fraction of its link speed; 1 is line rate.",
                   w=12, maximum=1),
        timeseries("Saturated time",
                   targets((f"rate(gpunet_nic_saturated_seconds_total{{{NIC}}}[{RI}])",
                            "{{instance}} {{device}} {{direction}}")),
                   "percentunit", "Fraction of time at >= 90% of link speed, at the exporter's fast tick.", w=8,
                   maximum=1),
        timeseries("PFC pause frames by priority and direction",
                   targets((f"sum by (instance, device, direction, priority) (rate({pauses}{{{NIC}}}[{RI}]))",
                            "{{instance}} {{device}} {{direction}} prio {{priority}}")),
                   "pps", "priority global = 802.3x link pause.", w=8),
        timeseries("PFC pause duration",
                   targets((f"sum by (instance, device, direction) "
                            f"(rate(gpunet_nic_pfc_pause_duration_seconds_total{{{NIC}}}[{RI}]))",
                            "{{instance}} {{device}} {{direction}}")),
                   "percentunit", "Fraction of time paused (receive) or pausing the peer (transmit), where the "
                   "driver counts it.", w=8),
        timeseries("ECN marks and CNPs",
                   targets((f"rate(gpunet_nic_ecn_marked_packets_total{{{NIC}}}[{RI}])", "{{instance}} {{device}} ECN"),
                           (f"rate(gpunet_nic_cnp_sent_total{{{NIC}}}[{RI}])", "{{instance}} {{device}} CNP sent"),
                           (f"rate(gpunet_nic_cnp_received_total{{{NIC}}}[{RI}])",
                            "{{instance}} {{device}} CNP received")),
                   "pps", "DCQCN per NIC: ECN-marked packets it received (notification point), CNPs it sent back "
                   "and CNPs it acted on (reaction point).", w=8),
        timeseries("RDMA loss events by kind",
                   targets((f"rate(gpunet_nic_rdma_loss_events_total{{{NIC}}}[{RI}])",
                            "{{instance}} {{device}} {{kind}}")),
                   "cps", "Go-back-N triggers per second, by kind: out-of-sequence, NAK sequence errors, ACK "
                   "timeouts. A lossless fabric has none.", w=8),
        timeseries("Discards and errors",
                   targets((f"rate(gpunet_nic_receive_discards_total{{{NIC}}}[{RI}])",
                            "{{instance}} {{device}} rx discards"),
                           (f"rate(gpunet_nic_transmit_discards_total{{{NIC}}}[{RI}])",
                            "{{instance}} {{device}} tx discards"),
                           (f"rate(gpunet_nic_receive_errors_total{{{NIC}}}[{RI}])",
                            "{{instance}} {{device}} rx errors")),
                   "pps", "Frames the port dropped for lack of buffer (discards) and received damaged (CRC and "
                   "symbol errors).", w=8),
        state_timeline("Link up", targets((f"gpunet_nic_up{{{NIC}}}", "{{instance}} {{device}}")),
                       "operstate up and carrier present.", w=12, mappings=UP_MAPPING),
        timeseries("Carrier changes and TCP retransmits",
                   targets((f"increase(gpunet_nic_carrier_changes_total{{{NIC}}}[{RI}])",
                            "{{instance}} {{device}} carrier changes"),
                           (f"rate(gpunet_tcp_retransmitted_segments_total{{{NODE}}}[{RI}])",
                            "{{instance}} TCP retransmits/s")),
                   "short", "Carrier changes per rate interval (a flapping link) and TCP segments retransmitted per "
                   "second (loss on TCP transports, NCCL sockets or gloo).", w=12),

        row("Configuration"),
        columns_table("NIC link and PCIe", [
            ("MTU", f"gpunet_nic_mtu_bytes{{{NIC}}}"),
            ("speed (B/s)", f"gpunet_nic_link_speed_bytes_per_second{{{NIC}}}"),
            *pcie_columns("nic", NIC)],
            "Per NIC: MTU, negotiated speed, and the PCIe link it trained against what it supports.", w=12),
        columns_table("NIC QoS per priority", [
            ("PFC", f"gpunet_nic_pfc_enabled{{{NIC}}}"),
            ("ECN, both points", f"min without (point) (gpunet_nic_ecn_enabled{{{NIC}}})")],
            "Per NIC and priority: PFC on (1) or off, and RoCE congestion control (ECN/DCQCN) on at both the "
            "notification and reaction points. The RoCE priority wants both; other priorities neither.", w=12),
        columns_table("GPU PCIe", pcie_columns("gpu", GPU),
            "Per GPU. An idle GPU lowers its transfer rate (Gen1) by design; fewer lanes is a fault.", w=12),
        table("Workloads on the node",
              [target(f"gpunet_gpu_workload_info{{{GPU}}}", "", instant=True, fmt="table")],
              "Which workload uses each GPU: Kubernetes pod (PodResources), Slurm job, or the process.", w=12),

        row("GPUs"),
        timeseries("GPU utilisation", targets((f"gpunet_gpu_utilization_ratio{{{GPU}}}", "{{instance}} GPU {{gpu}}")),
                   "percentunit", "Latest NVML utilisation.", w=12, maximum=1),
        timeseries("Busy / idle split by network state",
                   targets((f"sum by (instance) (rate(gpunet_gpu_busy_seconds_total{{{GPU}}}[{RI}]))"
                            f" / count by (instance) (gpunet_gpu_busy_seconds_total{{{GPU}}})", "{{instance}} busy"),
                           (f"sum by (instance, network_state) (rate(gpunet_gpu_idle_seconds_total{{{GPU}}}[{RI}]))"
                            f" / on (instance) group_left () count by (instance) (gpunet_gpu_busy_seconds_total{{{GPU}}})",
                            "{{instance}} idle, {{network_state}}")),
                   "percentunit", "Adds up to 1 per node.", stack=True, w=12, maximum=1),
        timeseries("Throttle reasons",
                   targets((f"rate(gpunet_gpu_throttled_seconds_total{{{GPU}}}[{RI}]) > 0",
                            "{{instance}} GPU {{gpu}} {{reason}}")),
                   "percentunit", "Fraction of time each clock-event reason was active (reasons never seen are hidden).",
                   w=12, maximum=1),
        timeseries("SM clock", targets((f"gpunet_gpu_sm_clock_hertz{{{GPU}}}", "{{instance}} GPU {{gpu}}")),
                   "hertz", "The SM clock: below the GPU's boost clock under load, it is throttled.", w=12,
                   minimum=None),
        timeseries("Power", targets((f"gpunet_gpu_power_watts{{{GPU}}}", "{{instance}} GPU {{gpu}}")),
                   "watt", "Power draw; at the power cap, clocks drop.", w=8),
        timeseries("Temperature", targets((f"gpunet_gpu_temperature_celsius{{{GPU}}}", "{{instance}} GPU {{gpu}}")),
                   "celsius", "GPU temperature; near the slowdown temperature, clocks drop.", w=8, minimum=None),
        timeseries("XID errors",
                   targets((f"increase(gpunet_gpu_xid_errors_total{{{GPU}}}[{RI}]) > 0",
                            "{{instance}} GPU {{gpu}} XID {{xid}}")),
                   "short", "Critical driver errors per XID code (only those that occurred).", w=8, draw="bars"),
        timeseries("GPU health: memory and NVLink errors",
                   targets((f"increase(gpunet_gpu_ecc_errors_total{{{GPU}}}[{RI}]) > 0",
                            "{{instance}} GPU {{gpu}} ECC {{type}}"),
                           (f"increase(gpunet_gpu_nvlink_errors_total{{{GPU}}}[{RI}]) > 0",
                            "{{instance}} GPU {{gpu}} NVLink {{kind}}"),
                           (f"gpunet_gpu_remapped_rows{{{GPU}}} > 0",
                            "{{instance}} GPU {{gpu}} rows remapped ({{cause}})"),
                           (f"gpunet_gpu_row_remap_pending{{{GPU}}} + 2 * gpunet_gpu_row_remap_failed{{{GPU}}} > 0",
                            "{{instance}} GPU {{gpu}} remap pending (1) / failed (2+)")),
                   "short", "What tells a sick GPU from a slow network: memory ECC errors and NVLink errors per rate "
                   "interval, rows remapped to spares, and a remap waiting for a reset (1) or failed (2: replace the "
                   "GPU). Only GPUs with something to show.", w=24, draw="bars"),
        timeseries("PHY errors",
                   targets((f"increase(gpunet_nic_symbol_errors_total{{{NIC}}}[{RI}]) > 0",
                            "{{instance}} {{device}} symbol errors"),
                           (f"increase(gpunet_nic_fec_uncorrectable_blocks_total{{{NIC}}}[{RI}]) > 0",
                            "{{instance}} {{device}} FEC uncorrectable"),
                           (f"rate(gpunet_nic_fec_corrected_bit_errors_total{{{NIC}}}[{RI}])",
                            "{{instance}} {{device}} FEC corrected bits/s")),
                   "short", "A degrading cable or optic shows here before it flaps: symbol errors and uncorrectable "
                   "FEC blocks per rate interval (only those that occurred), and the bits FEC corrects per second "
                   "(its rise is the link's margin shrinking).", w=12),
        timeseries("InfiniBand transmit wait",
                   targets((f"rate(gpunet_nic_transmit_wait_ticks_total{{{NIC}}}[{RI}])", "{{instance}} {{device}}")),
                   "short", "Ticks per second an InfiniBand port had data but no credit from its peer: IB's congestion "
                   "signal (it has no PFC). Compare ports: one far above its peers is congested or paused by a "
                   "slow receiver.", w=12),
        state_timeline("GPU up (NVML answers)", targets((f"gpunet_gpu_up{{{GPU}}}", "{{instance}} GPU {{gpu}}")),
                       "Whether NVML answered for each GPU; a GPU lost here fell off the bus or its driver hangs.",
                       w=24, h=6, mappings=UP_MAPPING),
    ]
    return dashboard("gpunet-node", "gpunet / Node drill-down",
                     "One node (pick $instance): every NIC and GPU counter the exporter has.",
                     panels, ["gpunet", "gpu", "network"])


def exporter() -> dict:
    COL = NODE
    panels = [
        stat("Collectors down", f"count(gpunet_exporter_collector_up{{{COL}}} == 0) or vector(0)", "short",
             "Collectors whose last run met an error, all selected nodes.", thresholds=[(None, "green"), (1, "red")]),
        stat("Exporters up", f'sum(up{{{COL}}})', "short", "Prometheus' own up series for the exporter targets."),
        stat("Late ticks /s", f"sum(rate(gpunet_exporter_ticks_late_total{{{COL}}}[{RI}]))", "short",
             "Ticks that started more than one interval late.", thresholds=[(None, "green"), (0.01, "orange")]),
        stat("Collector errors /s", f"sum(rate(gpunet_exporter_collector_errors_total{{{COL}}}[{RI}]))", "cps",
             "Source errors per second, all selected exporters (unreadable values, vanished devices).",
             thresholds=[(None, "green"), (0.01, "red")]),
        state_timeline("Collectors up", targets((f"gpunet_exporter_collector_up{{{COL}}}",
                                                 "{{instance}} {{collector}}")),
                       "1 when the collector's last run read every source without error.", w=24, h=10,
                       mappings=UP_MAPPING),
        timeseries("Collector duration",
                   targets((f"gpunet_exporter_collector_duration_seconds{{{COL}}}", "{{instance}} {{collector}}")),
                   "s", "How long each collector's last run took.", w=12),
        timeseries("Collector errors",
                   targets((f"rate(gpunet_exporter_collector_errors_total{{{COL}}}[{RI}])",
                            "{{instance}} {{collector}}")),
                   "short", "Source errors per second: unreadable or malformed value, device gone.", w=12),
        timeseries("Ticks",
                   targets((f"rate(gpunet_exporter_ticks_total{{{COL}}}[{RI}])", "{{instance}} {{tick}}"),
                           (f"1 / gpunet_exporter_tick_interval_seconds{{{COL}}}", "{{instance}} {{tick}} configured")),
                   "short", "Ticks per second against the configured rate.", w=12),
        timeseries("Late ticks",
                   targets((f"rate(gpunet_exporter_ticks_late_total{{{COL}}}[{RI}])", "{{instance}} {{tick}}")),
                   "short", "A tick that overran delays the next: slow sysfs, hung NVML.", w=12),
        timeseries("Collector last run age",
                   targets((f"time() - gpunet_exporter_collector_last_run_timestamp_seconds{{{COL}}}",
                            "{{instance}} {{collector}}")),
                   "s", "Seconds since the collector last ran (grows when a sampler thread is stuck).", w=12),
        timeseries("Scrape duration", targets((f"scrape_duration_seconds{{{COL}}}", "{{instance}}")),
                   "s", "How long Prometheus took to scrape the exporter (it renders cached samples: stays small).",
                   w=12),
        timeseries("Process CPU", targets((f"rate(process_cpu_seconds_total{{{COL}}}[{RI}])", "{{instance}}")),
                   "percentunit", "CPU cores used by the exporter process.", w=12),
        timeseries("Process RSS", targets((f"process_resident_memory_bytes{{{COL}}}", "{{instance}}")),
                   "bytes", "Resident memory of the exporter process (the systemd unit allows 128 MB).", w=12),
        table("Exporter versions", [target(f"gpunet_exporter_build_info{{{COL}}}", "", instant=True, fmt="table")],
              "The version and root of each exporter.", w=24, h=6),
    ]
    return dashboard("gpunet-exporter", "gpunet / Exporter health",
                     "Is the exporter itself working: collectors, ticks, scrapes, its own CPU and memory.",
                     panels, ["gpunet", "exporter"])


DASHBOARDS = {"gpunet-cluster.json": cluster, "gpunet-node.json": node, "gpunet-exporter.json": exporter}


def render(make) -> str:
    return json.dumps(make(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, make in DASHBOARDS.items():
        text = render(make)
        path = HERE / name
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print("stale (run python dashboards/build.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
