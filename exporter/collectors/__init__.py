"""Collectors: one per source, each turns readings into contract samples.

Each module registers its collector when imported (exporter/collector_registry.py); this
package imports them all, so importing it registers every collector. Within a tick the
collectors run in this import order.
"""

from exporter.collectors import (
    bond,  # noqa: F401
    driver_stats,  # noqa: F401
    gpu,  # noqa: F401  (fast)
    gpu_details,  # noqa: F401
    gpu_workload,  # noqa: F401
    netdev,  # noqa: F401
    nic_info,  # noqa: F401
    pcie,  # noqa: F401
    qos,  # noqa: F401
    rdma,  # noqa: F401
    tcp,  # noqa: F401
    wire,  # noqa: F401  (fast; feeds link_load, so it runs first)
)
