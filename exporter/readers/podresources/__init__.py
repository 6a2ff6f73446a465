"""Generated Python stubs of the kubelet PodResources API (api.proto; scripts/gen-podresources)."""
