#!/usr/bin/env bash
# tools/build.sh runs this in tools/mocknvml with the output directory as $1.
# cold: 25 s on 2 cores (Go module and build caches empty at the start of make tools)
set -euo pipefail
out="$1"
# NVIDIA's go-nvml mock machines behind NVML's C ABI (tools/mocknvml: k8s-test-infra's mock
# library is refused by the module proxy): a cgo shared library nvidia-ml-py loads like the
# driver's. go-nvml's generated cgo code uses APIs nvml.h marks deprecated: silence those. The
# driver's library carries the soname libnvidia-ml.so.1, and so does this one: a CDI spec mounts the
# versioned file only, and the container's ldconfig (the toolkit's update-ldcache hook) makes the
# soname link from it, as it does for the driver's own.
CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" \
  go build -trimpath -buildmode=c-shared -ldflags "-s -w -extldflags=-Wl,-soname,libnvidia-ml.so.1" \
  -o "$out/libnvidia-ml.so.1" .
rm -f "$out/libnvidia-ml.so.h"  # the cgo header go build writes beside the library
ln -sf libnvidia-ml.so.1 "$out/libnvidia-ml.so"
# A simulated node's driver (localcluster node add --machine): one library per machine with the machine,
# the device directory (visibility.go) and the node's MIG state file (state.go: the state of the node's
# GPUs, in the node's sysfs view, which every container on the node shares) linked in, since a workload
# container gets the driver's files from its CDI spec and never this project's environment. Only the
# link differs: seconds each.
NODE_STATE=/sys/devices/virtual/nvidia-mock/mig-state.json  # localcluster.node.MIG_STATE_PATH
for m in dgxa100 dgxh100 dgxh200 dgxb200; do
  mkdir -p "$out/mocknvml-node/$m"
  CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" \
    go build -trimpath -buildmode=c-shared \
    -ldflags "-s -w -X main.linkedMachine=$m -X main.linkedDevRoot=/dev -X main.linkedStatePath=$NODE_STATE -extldflags=-Wl,-soname,libnvidia-ml.so.1" \
    -o "$out/mocknvml-node/$m/libnvidia-ml.so.1" .
  rm -f "$out/mocknvml-node/$m/libnvidia-ml.so.h"
done
