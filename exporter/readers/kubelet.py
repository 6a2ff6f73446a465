"""Which pod holds which GPU: the kubelet's PodResources API (gRPC over a Unix socket).

The kubelet answers List with every pod on the node and the devices each of its
containers was given; the NVIDIA device plugin names a GPU by its UUID (``GPU-...``), a
MIG device by its MIG UUID (``MIG-...``), a time-sliced replica as ``<uuid>::<n>``. This
reader returns the GPU devices as plain rows; collectors/gpu_workload.py maps them to
NVML indices. The stubs are generated from podresources/api.proto.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from exporter.root import Root, SourceError

DEFAULT_SOCKET = "var/lib/kubelet/pod-resources/kubelet.sock"  # under --root
GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-.+)$")


@dataclass(frozen=True)
class PodDevice:
    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


def socket_path(root: Root, configured: str | None) -> str:
    """The socket to ask: the one configured (a path on this machine), else DEFAULT_SOCKET under the root."""
    return configured or str(root.path(DEFAULT_SOCKET))


class PodResources:
    """One channel to the kubelet, opened on first use and again after a failure (so a
    restarted kubelet is reached at once instead of after gRPC's reconnect backoff)."""

    def __init__(self, socket: str):
        self.socket = socket
        self._channel = None
        self._stub = None

    def exists(self) -> bool:
        """Whether the socket is there (no kubelet, or not mounted into the container: absent)."""
        return os.path.exists(self.socket)

    def where(self) -> str:
        return f"kubelet PodResources {self.socket}"

    def gpu_devices(self, timeout: float) -> list[PodDevice]:
        import grpc

        from exporter.readers.podresources import api_pb2, api_pb2_grpc

        if self._stub is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}")
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        try:
            response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as e:
            self.close()
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            raise SourceError(self.where(), f"List failed: {code.name if code else 'error'}: {details}") from None
        out = []
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if GPU_RESOURCE.match(devices.resource_name):
                        out.extend(PodDevice(pod.namespace, pod.name, container.name, devices.resource_name, d)
                                   for d in devices.device_ids)
        return out

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
