#!/usr/bin/env bash
# Build the agent image with no registry: a Debian base made by debootstrap from a Debian mirror, then
# buildah with node_agent/Dockerfile, the Python packages from PIP_INDEX_URL (a PyPI mirror works).
# What an air-gapped site does; CI runs it through tests/image/test_agent_image.py. Needs root,
# buildah and debootstrap (Debian/Ubuntu: apt-get install buildah debootstrap).
#
#   node_agent/image/build.sh [TAG]     default TAG: localhost/nvidia-gpu-agent:dev
#
# Environment:
#   DEBIAN_MIRROR       default http://deb.debian.org/debian
#   PIP_INDEX_URL       default https://pypi.org/simple
#   CA_DIR              extra CA certificates (*.crt) for the index, copied into the build (default none)
#   BUILDAH_ROOT        buildah's storage (default: buildah's own)
#   IMAGE_BASE_CACHE    where the debootstrap base is kept, keyed by suite and packages
#                       (default ${XDG_CACHE_HOME:-~/.cache}/nvidia-gpu/image-base)
#   SOURCE_DATE_EPOCH   a reproducible build (tools/release.py: the release commit's time): the image's
#                       created time, its history and every file of its own layers carry this time, so
#                       one commit built twice on one base is one digest
#   IMAGE_VERSION, IMAGE_REVISION, IMAGE_SOURCE
#                       the release's version, commit and repository URL, as the image's
#                       org.opencontainers.image.{version,revision,source} labels (default: none)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
tag="${1:-localhost/nvidia-gpu-agent:dev}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
packages=python3,python3-venv,ca-certificates
cache="${IMAGE_BASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvidia-gpu/image-base}"
storage=(--storage-driver vfs)
[ -n "${BUILDAH_ROOT:-}" ] && storage+=(--root "$BUILDAH_ROOT/root" --runroot "$BUILDAH_ROOT/run")
bah() { buildah "${storage[@]}" "$@"; }

key="$(printf '%s %s %s' "$suite" "$packages" "$(sha256sum "$0" | cut -c1-16)" | sha256sum | cut -c1-16)"
base_tar="$cache/$suite-$key.tar"
if [ ! -f "$base_tar" ]; then
  echo "image: debootstrap $suite ($packages) from $mirror" >&2
  mkdir -p "$cache"
  work="$(mktemp -d "$cache/.build-XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include="$packages" "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  # Nothing installs packages in the image: no apt caches, lists, docs or translations.
  rm -rf "$work/rootfs"/var/cache/apt/* "$work/rootfs"/var/lib/apt/lists/* "$work/rootfs"/usr/share/doc \
    "$work/rootfs"/usr/share/man "$work/rootfs"/usr/share/info "$work/rootfs"/usr/share/locale
  tar -C "$work/rootfs" --numeric-owner -cf "$work/base.tar" .
  mv "$work/base.tar" "$base_tar"
fi
base="localhost/nvidia-gpu-base:$suite-$key"
if ! bah inspect --type image "$base" >/dev/null 2>&1; then
  echo "image: importing the base as $base" >&2
  ctr="$(bah from scratch)"
  bah add --quiet "$ctr" "$base_tar" / >/dev/null
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/sh "$ctr"
  # No history: its entry would carry the import's time into every image built on it.
  bah commit --quiet --rm --omit-history "$ctr" "$base" >/dev/null
fi

# The context holds only what .dockerignore lets through, plus the CAs asked for.
context="$(mktemp -d)"
trap 'rm -rf "$context" ${work:+"$work"}' EXIT
(cd "$repo" && git ls-files -z -- requirements.txt requirements-agent.txt nvgpu node_agent \
  | xargs -0 cp --parents -t "$context")
if [ -n "${CA_DIR:-}" ]; then
  cp "$CA_DIR"/*.crt "$context/node_agent/image/ca/"
fi
release=()
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  release+=(--timestamp "$SOURCE_DATE_EPOCH" --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH")
fi
for label in version revision source; do
  value="$(printenv "IMAGE_${label^^}" || true)"
  [ -z "$value" ] || release+=(--label "org.opencontainers.image.$label=$value")
done
echo "image: building $tag from $base" >&2
bah build --quiet --isolation chroot --layers=false -f "$context/node_agent/Dockerfile" \
  --build-arg BASE_IMAGE="$base" --build-arg PIP_INDEX_URL="${PIP_INDEX_URL:-https://pypi.org/simple}" \
  "${release[@]}" -t "$tag" "$context" >/dev/null
echo "$tag"
