#!/usr/bin/env bash
# tools/build.sh runs this in tools/cdi with the output directory as $1.
# cold: 12 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# What a node's runtime does with CDI names: cdi-inject (tools/cdi/main.go) applies them to an OCI
# spec through the CNCF container-device-interface library containerd and CRI-O use; and the NVIDIA
# Container Toolkit's nvidia-cdi-hook, the program the hooks in our specs run.
go build -trimpath -ldflags "-s -w" -o "$out/cdi-inject" .
v="$(go list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit)"
# Also the toolkit's prestart hook (nvidia-container-runtime-hook), which nvidia-container-runtime adds to
# every container in its default (legacy) mode: it reads the toolkit config node setup writes and decides
# which GPUs the container is given. (The runtime itself does not build against this module's CDI library.)
go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${v#v}" \
  -o "$out/" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook
