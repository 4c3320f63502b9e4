#!/usr/bin/env bash
# tools/build.sh runs this in tools/mocknvml with the output directory as $1.
# cold: 25 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# NVIDIA's go-nvml mock machines behind NVML's C ABI (tools/mocknvml: k8s-test-infra's mock
# library is refused by the module proxy): a cgo shared library nvidia-ml-py loads like the
# driver's. go-nvml's generated cgo code uses APIs nvml.h marks deprecated: silence those.
CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" \
  go build -trimpath -buildmode=c-shared -ldflags "-s -w" -o "$out/libnvidia-ml.so.1" .
rm -f "$out/libnvidia-ml.so.h"  # the cgo header go build writes beside the library
ln -sf libnvidia-ml.so.1 "$out/libnvidia-ml.so"
