"""Collectors: one per source, each turns readings into contract samples.

Each module registers its collector when imported (exporter/collector_registry.py); this
package imports them all, so importing it registers every collector. Collectors are
independent of each other within a tick, so their order does not matter; the one exception,
the wire collector that link_load derives the network state from, is run first by the
sampler because it registered with feeds_link_load.
"""

from exporter.collectors import (
    bond,  # noqa: F401
    driver_stats,  # noqa: F401
    gpu,  # noqa: F401
    gpu_details,  # noqa: F401
    gpu_health,  # noqa: F401
    gpu_workload,  # noqa: F401
    netdev,  # noqa: F401
    nic_info,  # noqa: F401
    pcie,  # noqa: F401
    qos,  # noqa: F401
    rdma,  # noqa: F401
    tcp,  # noqa: F401
    wire,  # noqa: F401
)
