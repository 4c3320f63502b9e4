#!/usr/bin/env bash
# tools/build.sh runs this in tools/pulumi-yaml with the output directory as $1.
# cold: 37 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# Pulumi YAML's language host, for the YAML programs that use this repository's component package
# (PulumiPlugin.yaml). A module of its own: it builds against the pkg/v3 its go.mod names, which
# the CLI's module would move. The engine finds it on PATH, beside the CLI's directory.
v="$(go list -m -f '{{.Version}}' github.com/pulumi/pulumi-yaml)"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=$v" \
  -o "$out/" github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml
