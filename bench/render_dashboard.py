"""Render the main panels of the cluster-overview dashboard for one trace to a PNG.

    python bench/render_dashboard.py [TRACE] [--out docs/img/cluster-overview-pfc-storm.png]

Grafana cannot run here, so this does what it would: the trace is backfilled into a real
Prometheus (gpunet-trace load), the panels' own PromQL is read from
dashboards/gpunet-cluster.json (variables set to "All"), evaluated with query_range over
the trace's time range, and drawn with matplotlib. The incidents of TRACE.labels.json are
shaded. Needs prometheus, promtool and matplotlib. Same trace, same PNG bytes.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpunet.trace_cli import load, prometheus_command  # noqa: E402

SUBSTITUTIONS = {"$__rate_interval": "2m", "$__interval": "30s", "$instance": ".*", "$device": ".*",
                 "$gpu": ".*", "$job": ".*"}
STATE_COLORS = {"quiet": "#8fb8de", "active": "#73bf69", "saturated": "#ff9830", "paused": "#e02f44"}


def panel_exprs(dashboard: Path) -> dict[str, list[dict]]:
    dash = json.loads(dashboard.read_text(encoding="utf-8"))
    return {p["title"]: p.get("targets", []) for p in dash["panels"]}


def substitute(expr: str, range_s: float) -> str:
    for k, v in {**SUBSTITUTIONS, "$__range": f"{int(range_s)}s"}.items():
        expr = expr.replace(k, v)
    return expr


class Prometheus:
    def __init__(self, trace: Path, tmp: Path):
        self.first, self.last, _ = load(trace, tmp / "data")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(tmp / "prometheus.log", "wb")
        self.proc = subprocess.Popen(prometheus_command(tmp / "data", f"127.0.0.1:{port}"), stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"prometheus did not start: {(tmp / 'prometheus.log').read_text()}")
            time.sleep(0.1)

    def query_range(self, expr: str, step: float = 30.0) -> list[dict]:
        q = urllib.parse.urlencode({"query": expr, "start": self.first, "end": self.last, "step": step})
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{q}", timeout=60) as r:
            doc = json.load(r)
        return sorted(doc["data"]["result"], key=lambda s: sorted(s["metric"].items()))

    def query(self, expr: str, t: float) -> list[dict]:
        q = urllib.parse.urlencode({"query": expr, "time": t})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=60) as r:
            return json.load(r)["data"]["result"]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def series(result: list[dict]):
    """[(labels, times[datetime], values)] of a query_range result."""
    out = []
    for r in result:
        ts = [datetime.fromtimestamp(float(t), tz=UTC) for t, _ in r["values"]]
        vs = [float(v) for _, v in r["values"]]
        out.append((r["metric"], ts, vs))
    return out


def render(trace: Path, out: Path, dashboard: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    import numpy as np

    labels_path = trace.with_name(trace.name.removesuffix(".gz").removesuffix(".om") + ".labels.json")
    incidents = json.loads(labels_path.read_text())["incidents"] if labels_path.exists() else []
    exprs = panel_exprs(dashboard)

    with tempfile.TemporaryDirectory(prefix="gpunet-render-") as tmp:
        prom = Prometheus(trace, Path(tmp))
        try:
            span = prom.last - prom.first
            t0, t1 = (datetime.fromtimestamp(t, tz=UTC) for t in (prom.first, prom.last))

            def q(title: str, i: int = 0) -> list:
                return series(prom.query_range(substitute(exprs[title][i]["expr"], span)))

            idle = q("GPU idle fraction by network state")
            top_pauses = q("Top nodes by transmitted PFC pauses")
            util = q("NIC utilisation vs link speed, across nodes")
            signals = [(t["legendFormat"], series(prom.query_range(substitute(t["expr"], span))))
                       for t in exprs["ECN marks and CNPs"]]
            pfc = q("PFC pause frames by direction")
            bar_expr = substitute(exprs["Top nodes by transmitted PFC pauses (time range)"][0]["expr"], span)
            bars = sorted(((r["metric"]["instance"], float(r["value"][1])) for r in prom.query(bar_expr, prom.last)),
                          key=lambda x: (x[1], x[0]))
        finally:
            prom.close()

    plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "axes.titleweight": "bold",
                         "svg.hashsalt": "gpunet", "axes.grid": True, "grid.alpha": 0.3})
    fig = plt.figure(figsize=(13, 10.5), dpi=90)
    gs = fig.add_gridspec(3, 2, height_ratios=[1, 1.25, 1], hspace=0.42, wspace=0.18,
                          left=0.11, right=0.98, top=0.93, bottom=0.05)
    fmt = mdates.DateFormatter("%H:%M", tz=UTC)

    def shade(ax):
        for inc in incidents:
            ax.axvspan(datetime.fromtimestamp(inc["start"], tz=UTC),
                       datetime.fromtimestamp(inc["end"], tz=UTC), color="#e02f44", alpha=0.08, lw=0)
        ax.xaxis.set_major_formatter(fmt)
        ax.set_xlim(t0, t1)

    # 1. GPU idle by network state, stacked
    ax = fig.add_subplot(gs[0, 0])
    by_state = {m.get("network_state", "?"): (ts, vs) for m, ts, vs in idle}
    order = [s for s in ("quiet", "active", "saturated", "paused") if s in by_state]
    if order:
        ts = by_state[order[0]][0]
        ax.stackplot(ts, *[np.array(by_state[s][1][:len(ts)]) for s in order], labels=order,
                     colors=[STATE_COLORS[s] for s in order], alpha=0.85)
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0, decimals=0))
    ax.set_title("GPU idle fraction by network state (stacked)")
    ax.legend(loc="upper left", ncol=4, fontsize=7, frameon=False)
    shade(ax)

    # 2. top nodes by transmitted PFC pauses over time
    ax = fig.add_subplot(gs[0, 1])
    for m, ts, vs in top_pauses:
        ax.plot(ts, vs, lw=1.2, label=m.get("instance", "?").split(":")[0])
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("pause frames / s")
    ax.set_title("Top nodes by transmitted PFC pauses")
    ax.legend(loc="upper left", fontsize=7, frameon=False, ncol=2)
    shade(ax)

    # 3. NIC utilisation heatmap across nodes (one row per NIC)
    ax = fig.add_subplot(gs[1, :])
    rows = sorted(util, key=lambda s: (s[0].get("instance", ""), s[0].get("device", "")))
    grid_t = sorted({t for _, ts, _ in rows for t in ts})
    index = {t: i for i, t in enumerate(grid_t)}
    z = np.full((len(rows), len(grid_t)), np.nan)
    for r, (_, ts, vs) in enumerate(rows):
        for t, v in zip(ts, vs):
            z[r, index[t]] = v
    if grid_t:
        x0, x1 = mdates.date2num(grid_t[0]), mdates.date2num(grid_t[-1])
        im = ax.imshow(z, aspect="auto", cmap="turbo", vmin=0, vmax=1, interpolation="nearest",
                       extent=(x0, x1, len(rows) - 0.5, -0.5))
        ax.xaxis_date(tz=UTC)
        cb = fig.colorbar(im, ax=ax, pad=0.01, fraction=0.03)
        cb.ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0, decimals=0))
        cb.set_label("of link speed")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{m.get('instance', '').split(':')[0]} {m.get('device', '')}" for m, _, _ in rows],
                       fontsize=5.5)
    ax.grid(False)
    ax.set_title("NIC utilisation vs link speed, across nodes (busier direction)")
    for inc in incidents:
        for edge in (inc["start"], inc["end"]):
            ax.axvline(datetime.fromtimestamp(edge, tz=UTC), color="white", lw=1, ls="--")
    ax.xaxis.set_major_formatter(fmt)
    ax.set_xlim(t0, t1)
    ax.set_xlabel("time (UTC); dashed: incident window", fontsize=7)

    # 4. ECN / CNP / PFC rates, cluster-wide
    ax = fig.add_subplot(gs[2, 0])
    for legend, ss in signals:
        for _metric, ts, vs in ss:
            ax.plot(ts, vs, lw=1.2, label=legend)
    for m, ts, vs in pfc:
        ax.plot(ts, vs, lw=1.2, ls="--", label=f"PFC pauses {m.get('direction', '')}")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("per second, all NICs")
    ax.set_title("ECN marks, CNPs and PFC pauses")
    ax.legend(loc="upper left", fontsize=7, frameon=False, ncol=2)
    shade(ax)

    # 5. top nodes by transmitted pauses over the range
    ax = fig.add_subplot(gs[2, 1])
    names = [n.split(":")[0] for n, _ in bars]
    values = [v for _, v in bars]
    colors = ["#e02f44" if v == max(values, default=0) and v > 0 else "#5794f2" for v in values]
    ax.barh(names, values, color=colors)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("pause frames transmitted over the trace")
    ax.set_title("Top nodes by transmitted PFC pauses (time range)")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", visible=False)

    fig.suptitle(f"gpunet / Cluster overview - {trace.name}"
                 + ("".join(f"   |   shaded: {i['class']} on {', '.join(n.split(':')[0] for n in i['nodes'])}"
                            for i in incidents)),
                 fontsize=11, fontweight="bold")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", default=str(REPO / "replay_data" / "pfc_storm.om.gz"))
    p.add_argument("--out", default=str(REPO / "docs" / "img" / "cluster-overview-pfc-storm.png"))
    p.add_argument("--dashboard", default=str(REPO / "dashboards" / "gpunet-cluster.json"))
    args = p.parse_args(argv)
    render(Path(args.trace), Path(args.out), Path(args.dashboard))
    print(f"wrote {args.out} ({Path(args.out).stat().st_size // 1024} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
