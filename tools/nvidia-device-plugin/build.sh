#!/usr/bin/env bash
# tools/build.sh runs this in tools/nvidia-device-plugin with the output directory as $1.
# cold: 65 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# NVIDIA's own device plugin and GPU feature discovery, the peers the comparison (make compare) runs
# beside our agent. go-nvml loads libnvidia-ml.so.1 with dlopen, so they run on the mock NVML above.
# The proxy serves v0.19.1 (not the v0.20.0 the reference notes read); its nvidia-container-toolkit
# pseudo-version is unknown to the checksum database, so go.sum carries the plugin's own sums for it.
v="$(go list -m -f '{{.Version}}' github.com/NVIDIA/k8s-device-plugin)"
go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/k8s-device-plugin/internal/info.version=$v" -o "$out/" \
  github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin \
  github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery
