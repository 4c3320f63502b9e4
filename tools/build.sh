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

components=(prometheus kube etcd kwok mocknvml pulumi pulumi-yaml pulumi-kubernetes cdi runc nvidia-device-plugin mig-parted dra-driver-nvidia-gpu
            actionlint container-toolkit)

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
    pulumi)
      # The Pulumi CLI (pkg/v3 at the version of its go.mod: the proxy has no pkg/v3 at the venv's
      # pulumi 3.272.0) and the Python language host the engine starts for `runtime: python`.
      # Pulumi's own host module is refused by the proxy, so tools/pulumi/pulumi-language-python is
      # a small one of ours; it runs programs with the pulumi-language-python-exec script of the
      # pinned sdk/v3. The engine looks for language hosts beside the pulumi binary (symlinks
      # resolved), so all three go into this one directory.
      local v; v="$(go list -m -f '{{.Version}}' github.com/pulumi/pulumi/pkg/v3)"
      # `go list -m` names a module's directory only once it is in the module cache (cold: empty).
      go mod download github.com/pulumi/pulumi/sdk/v3
      local sdk; sdk="$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)"
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$v" \
        -o "$out/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${v#v}" -o "$out/pulumi-language-python" \
        ./pulumi-language-python
      install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$out/" ;;
    pulumi-yaml)
      # Pulumi YAML's language host, for the YAML programs that use this repository's component package
      # (PulumiPlugin.yaml). A module of its own: it builds against the pkg/v3 its go.mod names, which
      # the CLI's module would move. The engine finds it on PATH, beside the CLI's directory.
      local v; v="$(go list -m -f '{{.Version}}' github.com/pulumi/pulumi-yaml)"
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=$v" \
        -o "$out/" github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml ;;
    pulumi-kubernetes)
      # The provider's main package embeds schema-embed.json and terraform-mapping-embed.json, which
      # its `go generate` (generate.go, build tag ignore) writes from schema.json with the release
      # version stamped in; the module zip has neither. So the package is copied out of the
      # read-only module cache into a scratch copy of this module (same go.mod and go.sum, so the
      # same dependencies), generated and built there. The proxy serves only one provider/v4
      # pseudo-version (see go.mod); it is stamped 4.34.2, the pulumi_kubernetes Python package's
      # version, which is the provider version that SDK asks the engine for.
      local v=4.34.2 src="$out/.src"
      go mod download github.com/pulumi/pulumi-kubernetes/provider/v4  # cold cache: see the pulumi branch
      local cmd; cmd="$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi-kubernetes/provider/v4)/cmd/pulumi-resource-kubernetes"
      mkdir -p "$src/cmd"; cp go.mod go.sum "$src/"
      cp -r "$cmd" "$src/cmd/"; chmod -R u+w "$src"
      ( cd "$src/cmd/pulumi-resource-kubernetes" && VERSION="$v" go run generate.go )
      ( cd "$src" && CGO_ENABLED=0 go build -trimpath \
          -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$v" \
          -o "$out/pulumi-resource-kubernetes" ./cmd/pulumi-resource-kubernetes )
      rm -rf "$src" ;;
    cdi)
      # What a node's runtime does with CDI names: cdi-inject (tools/cdi/main.go) applies them to an OCI
      # spec through the CNCF container-device-interface library containerd and CRI-O use; and the NVIDIA
      # Container Toolkit's nvidia-cdi-hook, the program the hooks in our specs run.
      go build -trimpath -ldflags "-s -w" -o "$out/cdi-inject" .
      local v; v="$(go list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit)"
      # Also the toolkit's prestart hook (nvidia-container-runtime-hook), which nvidia-container-runtime adds to
      # every container in its default (legacy) mode: it reads the toolkit config node setup writes and decides
      # which GPUs the container is given. (The runtime itself does not build against this module's CDI library.)
      go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${v#v}" \
        -o "$out/" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook ;;
    runc)
      # runc, the OCI runtime containerd and CRI-O start containers with, in its own module (runc 1.3
      # and the CDI library want different runtime-spec versions). Built without the seccomp tag (no
      # libseccomp here): the tests' containers carry no seccomp profile.
      local v; v="$(go list -m -f '{{.Version}}' github.com/opencontainers/runc)"
      go build -trimpath -ldflags "-s -w -X main.version=${v#v}" -o "$out/runc" github.com/opencontainers/runc ;;
    nvidia-device-plugin)
      # NVIDIA's own device plugin and GPU feature discovery, the peers the comparison (make compare) runs
      # beside our agent. go-nvml loads libnvidia-ml.so.1 with dlopen, so they run on the mock NVML above.
      # The proxy serves v0.19.1 (not the v0.20.0 the reference notes read); its nvidia-container-toolkit
      # pseudo-version is unknown to the checksum database, so go.sum carries the plugin's own sums for it.
      local v; v="$(go list -m -f '{{.Version}}' github.com/NVIDIA/k8s-device-plugin)"
      go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/k8s-device-plugin/internal/info.version=$v" -o "$out/" \
        github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin \
        github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery ;;
    mig-parted)
      # NVIDIA's mig-parted (the proxy serves v0.13.1 of it, not the notes' v0.15.0).
      local v; v="$(go list -m -f '{{.Version}}' github.com/NVIDIA/mig-parted)"
      go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/mig-parted/internal/info.version=$v" -o "$out/" \
        github.com/NVIDIA/mig-parted/cmd/nvidia-mig-parted ;;
    dra-driver-nvidia-gpu)
      # The DRA driver's GPU kubelet plugin, under the module path its go.mod declares since it moved to
      # kubernetes-sigs (v0.4.1: the release after the v0.4.0 the notes read), and the nvidia-cdi-hook it
      # requires at start (the CDI specs it writes call it), from the nvidia-container-toolkit it pins.
      local v; v="$(go list -m -f '{{.Version}}' sigs.k8s.io/dra-driver-nvidia-gpu)"
      go build -trimpath -ldflags "-s -w -X sigs.k8s.io/dra-driver-nvidia-gpu/internal/info.version=$v" -o "$out/" \
        sigs.k8s.io/dra-driver-nvidia-gpu/cmd/gpu-kubelet-plugin
      go build -trimpath -ldflags "-s -w" -o "$out/" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook ;;
    container-toolkit)
      # NVIDIA's toolkit container's installer (nvidia-ctk-installer) and the Go programs of the toolkit it
      # installs, at the release of the stack's default toolkit image, in a directory of their own (the cdi
      # component's nvidia-cdi-hook is another release's): the toolkit-container tests install from them.
      local v; v="$(go list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit)"
      mkdir -p "$out/container-toolkit"
      go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${v#v}" \
        -o "$out/container-toolkit/" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk-installer \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.cdi \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.legacy \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook ;;
    actionlint)
      # actionlint, which `make test` runs over .github/workflows (tests/test_workflows.py); it runs
      # shellcheck on each `run:` script when shellcheck is on PATH (.ci/run installs it).
      local v; v="$(go list -m -f '{{.Version}}' github.com/rhysd/actionlint)"
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/rhysd/actionlint.version=$v" -o "$out/" \
        github.com/rhysd/actionlint/cmd/actionlint ;;
    prometheus)
      # Prometheus's promtool, which runs the stack's alerting rules over synthetic series (promtool test
      # rules) and checks them. remove_all_sd leaves out the service-discovery plugins promtool never uses
      # (their cloud SDKs are most of the build).
      local v; v="$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
      CGO_ENABLED=0 go build -trimpath -tags remove_all_sd \
        -ldflags "-s -w -X github.com/prometheus/common/version.Version=${v#v} -X github.com/prometheus/common/version.Branch=release" \
        -o "$out/" github.com/prometheus/prometheus/cmd/promtool ;;
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
