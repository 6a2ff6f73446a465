"""The gpunet node exporter: NIC and GPU counters at a fast tick, served to Prometheus."""
