#!/usr/bin/env bash
# tools/build.sh runs this in tools/actionlint with the output directory as $1.
# cold: 3 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# actionlint, which `make test` runs over .github/workflows (tests/repo/test_workflows.py); it runs
# shellcheck on each `run:` script when shellcheck is on PATH (.ci/run installs it).
v="$(go list -m -f '{{.Version}}' github.com/rhysd/actionlint)"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/rhysd/actionlint.version=$v" -o "$out/" \
  github.com/rhysd/actionlint/cmd/actionlint
