#!/usr/bin/env bash
# tools/build.sh runs this in tools/cni-plugins with the output directory as $1.
# cold: 33 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# Into a cni/ subdirectory: a node's containerd takes a directory of plugins (bin_dirs), and the plugins'
# names (bridge, loopback, portmap, host-local) are too generic to sit in the shared bin directory.
v="$(go list -m -f '{{.Version}}' github.com/containernetworking/plugins)"
mkdir -p "$out/cni"
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$v" \
  -o "$out/cni/" \
  github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/meta/portmap
