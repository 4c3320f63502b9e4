#!/usr/bin/env bash
# What `make test` needs from the machine besides the virtualenv and the Go modules, checked on every
# run (a few milliseconds when all is there) and installed where it can be: as root on Debian or Ubuntu,
# with apt-get. Elsewhere it stops with one line naming what to install. Go is checked, never installed
# (distributions ship older releases than the tools modules need: install it from go.dev/dl).
#
#   shellcheck    the node-setup scripts and the workflows' run: steps are linted with it
#   openssl       the local control plane's certificates
#   buildah, debootstrap
#                 the agent image is built offline from a debootstrap base (tests/image)
#   gcc           cgo: NVIDIA's mock NVML is a shared library built from Go (tools/mocknvml)
#   unshare       util-linux: NVIDIA's programs run in private mount namespaces (tests/compare)
#   git           the URN test exports the program as an earlier commit had it
#   libseccomp-dev
#                 runc is built with seccomp (tools/runc): the kubelet gives pod sandboxes RuntimeDefault
#   iptables, ip  a real node's CNI plugins (bridge, portmap) and its Service address, in the node's netns
#   nsenter       util-linux: a real node's containerd and kubelet run in the node's namespaces
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

# command -> the Debian package that provides it
declare -A package=([shellcheck]=shellcheck [openssl]=openssl [buildah]=buildah [debootstrap]=debootstrap
                    [gcc]=gcc [unshare]=util-linux [nsenter]=util-linux [git]=git [iptables]=iptables
                    [ip]=iproute2)
missing=()
for cmd in shellcheck openssl buildah debootstrap gcc unshare nsenter git iptables ip; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${package[$cmd]}")
done
# A library, not a command: its header is what cgo needs.
[ -f "${DEPS_INCLUDE_DIR:-/usr/include}/seccomp.h" ] || missing+=(libseccomp-dev)

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps: installing ${missing[*]} (apt-get, once) ..." >&2
    start=$(date +%s)
    export DEBIAN_FRONTEND=noninteractive
    # Another clone's make test may be installing at the same moment: wait for dpkg's lock, do not fail.
    # (debconf's note that apt-utils is missing is noise on a minimal system.)
    lock=(-o DPkg::Lock::Timeout=600)
    apt-get "${lock[@]}" update -qq >/dev/null
    apt-get "${lock[@]}" install -y -qq --no-install-recommends "${missing[@]}" 2> >(grep -v '^debconf: ' >&2) >/dev/null
    echo "deps: installed in $(( $(date +%s) - start )) s" >&2
  else
    echo "deps: make test needs ${missing[*]}: install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}), or run make test as root on Debian or Ubuntu, which installs them" >&2
    exit 1
  fi
fi

# Go: at least the newest `go` directive of the tools modules.
want="$(sed -n 's/^go \([0-9][0-9.]*\)$/\1/p' "$here"/*/go.mod | sort -V | tail -1)"
if ! command -v go >/dev/null 2>&1; then
  echo "deps: make test needs Go $want or newer to build the pinned components (make tools): install it from https://go.dev/dl and put it on PATH" >&2
  exit 1
fi
have="$(go env GOVERSION)"; have="${have#go}"
if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]; then
  echo "deps: Go $have is older than the $want the tools modules need (tools/*/go.mod): install a newer one from https://go.dev/dl" >&2
  exit 1
fi
