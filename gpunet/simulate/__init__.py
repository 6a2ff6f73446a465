"""Cluster simulator: labelled replay traces of data-parallel training on a GPU cluster,
with the faults of docs/classes.md and the confounders that must not be mistaken for them.

    from gpunet.simulate import simulate, SimSpec
    result = simulate(SimSpec(...))      # or the CLI: gpunet-simulate --help

Modules: params (spec dataclasses, parsing), cluster (names, devices), conditions (what the
physics reads, per segment of time), faults (each class's effect and signature), physics
(step schedule, fast tick), scrape (scrape times, restarts), node (one node's counters),
engine (putting it together), output (trace + labels.json), cli, suite (committed traces
and evaluation suites), calibrate lives in engine.
"""

from gpunet.extras import DIAGNOSER_EXTRA, require

require("diagnoser", DIAGNOSER_EXTRA, "gpunet-simulate")

from gpunet.simulate.params import (  # noqa: E402 (after the check that says what is missing)
    ClusterParams,
    ConfounderSpec,
    FabricParams,
    FaultSpec,
    JobParams,
    ScrapeParams,
    SimSpec,
)


def simulate(spec: SimSpec, log=None):
    from gpunet.simulate.engine import simulate as _simulate
    return _simulate(spec, log)


__all__ = ["simulate", "SimSpec", "ClusterParams", "JobParams", "FabricParams", "ScrapeParams", "FaultSpec",
           "ConfounderSpec"]
