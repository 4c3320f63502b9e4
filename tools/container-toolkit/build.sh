#!/usr/bin/env bash
# tools/build.sh runs this in tools/container-toolkit with the output directory as $1.
# cold: 13 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# NVIDIA's toolkit container's installer (nvidia-ctk-installer) and the Go programs of the toolkit it
# installs, at the release of the stack's default toolkit image, in a directory of their own (the cdi
# component's nvidia-cdi-hook is another release's): the toolkit-container tests install from them.
v="$(go list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit)"
mkdir -p "$out/container-toolkit"
go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${v#v}" \
  -o "$out/container-toolkit/" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk-installer \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.cdi \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.legacy \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook
