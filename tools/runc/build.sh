#!/usr/bin/env bash
# tools/build.sh runs this in tools/runc with the output directory as $1.
# cold: 84 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# runc, the OCI runtime containerd and CRI-O start containers with, in its own module (runc 1.3
# and the CDI library want different runtime-spec versions). With the seccomp tag (cgo, libseccomp-dev,
# tools/deps.sh): the kubelet gives every pod sandbox the RuntimeDefault profile, and a runc without
# seccomp refuses it ("config provided but seccomp not supported").
v="$(go list -m -f '{{.Version}}' github.com/opencontainers/runc)"
CGO_ENABLED=1 go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=${v#v}" -o "$out/runc" \
  github.com/opencontainers/runc
