"""gpunet: see when GPU training waits on the network, and why."""

__version__ = "0.1.0"
