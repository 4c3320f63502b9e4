#!/usr/bin/env bash
# tools/build.sh runs this in tools/runc with the output directory as $1.
# cold: 10 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# runc, the OCI runtime containerd and CRI-O start containers with, in its own module (runc 1.3
# and the CDI library want different runtime-spec versions). Built without the seccomp tag (no
# libseccomp here): the tests' containers carry no seccomp profile.
v="$(go list -m -f '{{.Version}}' github.com/opencontainers/runc)"
go build -trimpath -ldflags "-s -w -X main.version=${v#v}" -o "$out/runc" github.com/opencontainers/runc
