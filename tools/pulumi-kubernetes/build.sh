#!/usr/bin/env bash
# tools/build.sh runs this in tools/pulumi-kubernetes with the output directory as $1.
# cold: 200 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# The provider's main package embeds schema-embed.json and terraform-mapping-embed.json, which
# its `go generate` (generate.go, build tag ignore) writes from schema.json with the release
# version stamped in; the module zip has neither. So the package is copied out of the
# read-only module cache into a scratch copy of this module (same go.mod and go.sum, so the
# same dependencies), generated and built there. The proxy serves only one provider/v4
# pseudo-version (see go.mod); it is stamped 4.34.2, the pulumi_kubernetes Python package's
# version, which is the provider version that SDK asks the engine for.
v=4.34.2 src="$out/.src"
go mod download github.com/pulumi/pulumi-kubernetes/provider/v4  # cold cache: see the pulumi branch
cmd="$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi-kubernetes/provider/v4)/cmd/pulumi-resource-kubernetes"
mkdir -p "$src/cmd"; cp go.mod go.sum "$src/"
cp -r "$cmd" "$src/cmd/"; chmod -R u+w "$src"
# The generator with the provider's own build flags: it imports pkg/v3/codegen/schema, which the provider
# imports too, so the compiled packages are shared through Go's build cache instead of built twice
# (a plain `go run`, with cgo on and without -trimpath, compiled its whole closure a second time).
( cd "$src/cmd/pulumi-resource-kubernetes" && VERSION="$v" CGO_ENABLED=0 go run -trimpath generate.go )
# The Go SDK's yaml/v2 kinds.go, which compiles the whole generated Go SDK for components the tests never
# use, is replaced by overlay/yaml_v2_kinds.go.overlay (that file says why): 250 of 390 build seconds. Go
# takes no overlay of a file in its module cache, so the scratch module builds against a copy of the SDK
# module (the same version, so the same dependencies) with that one file replaced.
go mod download github.com/pulumi/pulumi-kubernetes/sdk/v4  # `go list -m` names no directory before this
sdk="$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi-kubernetes/sdk/v4)"
[ -d "$sdk" ] || { echo "the Go SDK module of the Kubernetes provider is not in the module cache" >&2; exit 1; }
cp -r "$sdk" "$src/sdk-v4"; chmod -R u+w "$src/sdk-v4"
cp overlay/yaml_v2_kinds.go.overlay "$src/sdk-v4/go/kubernetes/yaml/v2/kinds.go"
( cd "$src" && go mod edit -replace github.com/pulumi/pulumi-kubernetes/sdk/v4=./sdk-v4 )
( cd "$src" && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$v" \
    -o "$out/pulumi-resource-kubernetes" ./cmd/pulumi-resource-kubernetes )
rm -rf "$src"
