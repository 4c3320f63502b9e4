#!/usr/bin/env bash
# tools/build.sh runs this in tools/mig-parted with the output directory as $1.
# cold: 10 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# NVIDIA's mig-parted (the proxy serves v0.13.1 of it, not the notes' v0.15.0).
v="$(go list -m -f '{{.Version}}' github.com/NVIDIA/mig-parted)"
go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/mig-parted/internal/info.version=$v" -o "$out/" \
  github.com/NVIDIA/mig-parted/cmd/nvidia-mig-parted
