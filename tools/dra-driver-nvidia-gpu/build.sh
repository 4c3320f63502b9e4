#!/usr/bin/env bash
# tools/build.sh runs this in tools/dra-driver-nvidia-gpu with the output directory as $1.
# cold: 68 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# The DRA driver's GPU kubelet plugin, under the module path its go.mod declares since it moved to
# kubernetes-sigs (v0.4.1: the release after the v0.4.0 the notes read), and the nvidia-cdi-hook it
# requires at start (the CDI specs it writes call it), from the nvidia-container-toolkit it pins.
v="$(go list -m -f '{{.Version}}' sigs.k8s.io/dra-driver-nvidia-gpu)"
go build -trimpath -ldflags "-s -w -X sigs.k8s.io/dra-driver-nvidia-gpu/internal/info.version=$v" -o "$out/" \
  sigs.k8s.io/dra-driver-nvidia-gpu/cmd/gpu-kubelet-plugin
go build -trimpath -ldflags "-s -w" -o "$out/" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
