#!/usr/bin/env bash
# tools/build.sh runs this in tools/prometheus with the output directory as $1.
# cold: 123 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# Prometheus's promtool, which runs the stack's alerting rules over synthetic series (promtool test
# rules) and checks them. remove_all_sd leaves out the service-discovery plugins promtool never uses
# (their cloud SDKs are most of the build).
v="$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
CGO_ENABLED=0 go build -trimpath -tags remove_all_sd \
  -ldflags "-s -w -X github.com/prometheus/common/version.Version=${v#v} -X github.com/prometheus/common/version.Branch=release" \
  -o "$out/" github.com/prometheus/prometheus/cmd/promtool
