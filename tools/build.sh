#!/usr/bin/env bash
# Builds the pinned real components the cluster tests run (see tools/*/go.mod) into a cache outside
# the clone, keyed by every file of each tools module and this script, so a warm cache costs nothing.
# Progress goes to stderr; the last line on stdout is the directory holding every binary.
#
#   tools/build.sh            build what is missing, print the bin directory
#   tools/build.sh --print    print the bin directory if every component is cached, else exit 1
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${NVIDIA_GPU_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvidia-gpu/tools}"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -mod=mod"
export CGO_ENABLED="${CGO_ENABLED:-1}"
print_only=0
[ "${1:-}" = "--print" ] && print_only=1

components=(kube etcd kwok mocknvml)

key_of() {  # key_of NAME: a short hash of what decides the component's binaries
  # Every file of tools/NAME (names and contents, in a fixed order: go.mod, go.sum and any sources,
  # such as mocknvml's) plus this script. A library built by hand inside the module is not an input.
  ( cd "$here" && find "$1" -type f ! -name 'lib*.so*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    sha256sum build.sh ) | sha256sum | cut -c1-16
}

build_one() {  # build_one NAME OUTDIR
  local name="$1" out="$2"
  cd "$here/$name"
  case "$name" in
    kube)
      local v; v="$(awk '$1=="k8s.io/kubernetes"{print $2; exit} $2=="k8s.io/kubernetes"{print $3; exit}' go.mod)"
      local minor; minor="$(echo "$v" | cut -d. -f2)"
      local ld="-s -w -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1"
      ld="$ld -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
      ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$v -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
      CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$out/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kube-controller-manager ;;
    etcd)
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3 ;;
    kwok)
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok
      # kwok ships its node and pod lifecycles as Stage objects beside the code: take the fast ones
      # (Ready at once, pods Running) and the lease heartbeat from the pinned module.
      local stages; stages="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
      for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
               pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        echo "---"; cat "$stages/$f"
      done > "$out/kwok-stages.yaml" ;;
    mocknvml)
      # NVIDIA's go-nvml mock machines behind NVML's C ABI (tools/mocknvml: k8s-test-infra's mock
      # library is refused by the module proxy): a cgo shared library nvidia-ml-py loads like the
      # driver's. go-nvml's generated cgo code uses APIs nvml.h marks deprecated: silence those.
      CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" \
        go build -trimpath -buildmode=c-shared -ldflags "-s -w" -o "$out/libnvidia-ml.so.1" .
      rm -f "$out/libnvidia-ml.so.h"  # the cgo header go build writes beside the library
      ln -sf libnvidia-ml.so.1 "$out/libnvidia-ml.so" ;;
  esac
}

bindir_parts=()
for name in "${components[@]}"; do
  [ -f "$here/$name/go.mod" ] || continue
  key="$(key_of "$name")"
  dir="$cache/$name-$key"
  bindir_parts+=("$name-$key")
  if [ -f "$dir/.complete" ]; then
    continue
  fi
  if [ "$print_only" = 1 ]; then
    echo "tools: $name is not built (run make tools)" >&2
    exit 1
  fi
  echo "tools: building $name ($key) into $dir ..." >&2
  start=$(date +%s)
  tmp="$cache/.tmp-$name-$key-$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  ( build_one "$name" "$tmp" ) >&2
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  # Older pins of this component are not used any more.
  for old in "$cache/$name"-*; do [ "$old" = "$dir" ] || rm -rf "$old"; done
  echo "tools: $name built in $(( $(date +%s) - start )) s" >&2
done

# One directory that names every binary: symlinks into the per-component directories.
combined="$cache/bin-$(printf '%s\n' "${bindir_parts[@]}" | sha256sum | cut -c1-16)"
if [ ! -f "$combined/.complete" ]; then
  [ "$print_only" = 1 ] && { echo "tools: bin directory missing (run make tools)" >&2; exit 1; }
  mkdir -p "$combined"
  for part in "${bindir_parts[@]}"; do
    for f in "$cache/$part"/*; do ln -sfn "$f" "$combined/$(basename "$f")"; done
  done
  touch "$combined/.complete"
  for old in "$cache"/bin-*; do [ "$old" = "$combined" ] || rm -rf "$old"; done
fi
du -sh "$cache" 2>/dev/null | awk '{print "tools: cache " $1 " in '"$cache"'"}' >&2
echo "$combined"
