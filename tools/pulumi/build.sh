#!/usr/bin/env bash
# tools/build.sh runs this in tools/pulumi with the output directory as $1.
# cold: 247 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# The Pulumi CLI (pkg/v3 at the version of its go.mod: the proxy has no pkg/v3 at the venv's
# pulumi 3.272.0) and the Python language host the engine starts for `runtime: python`.
# Pulumi's own host module is refused by the proxy, so tools/pulumi/pulumi-language-python is
# a small one of ours; it runs programs with the pulumi-language-python-exec script of the
# pinned sdk/v3. The engine looks for language hosts beside the pulumi binary (symlinks
# resolved), so all three go into this one directory.
v="$(go list -m -f '{{.Version}}' github.com/pulumi/pulumi/pkg/v3)"
# `go list -m` names a module's directory only once it is in the module cache (cold: empty).
go mod download github.com/pulumi/pulumi/sdk/v3
sdk="$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$v" \
  -o "$out/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${v#v}" -o "$out/pulumi-language-python" \
  ./pulumi-language-python
install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$out/"
# `pulumi package gen-sdk` asks the language's host to generate an SDK, and Pulumi's Node.js and Go hosts are
# refused by the proxy too: pulumi-language-sdkgen is that part of them (the CLI's own codegen/nodejs and
# codegen/go at this pkg/v3), built once per language.
for lang in nodejs go; do
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.language=$lang -X main.version=${v#v}" \
    -o "$out/pulumi-language-$lang" ./pulumi-language-sdkgen
done
