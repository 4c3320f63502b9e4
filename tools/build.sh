#!/usr/bin/env bash
# Builds the pinned real components the tests run into a cache outside the clone. Each component is a
# directory here: its Go module (go.mod, go.sum, tools.go or sources) and its recipe (build.sh OUT,
# run in that directory; its "# cold:" line is the seconds a cold build took on 2 cores). A component
# is keyed by every file of its directory and the Go release, so a pin change rebuilds that component
# only, and a warm cache costs nothing. Progress goes to stderr; the last line on stdout is the
# directory holding every binary.
#
#   tools/build.sh            build what is missing, print the bin directory
#   tools/build.sh --print    print the bin directory if every component is cached, else exit 1
#
# Several clones may share the cache at once: builds take a lock (the second waits, then finds the
# first's result), and a component no clone has used for $KEEP_DAYS days is removed, never one in use.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${NVIDIA_GPU_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvidia-gpu/tools}"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -mod=mod"
export CGO_ENABLED="${CGO_ENABLED:-1}"
KEEP_DAYS=14
print_only=0
[ "${1:-}" = "--print" ] && print_only=1

# Every directory here with a recipe is a component (adding one is adding its directory), in a fixed order.
export LC_ALL=C
components=()
for recipe in "$here"/*/build.sh; do components+=("$(basename "$(dirname "$recipe")")"); done

if ! command -v go >/dev/null 2>&1; then
  echo "tools: Go is not on PATH: install it (make deps says which release)" >&2
  exit 1
fi
go_version="$(go env GOVERSION)"

key_of() {  # key_of NAME: a short hash of what decides the component's binaries
  # Every file of tools/NAME (names and contents, in a fixed order: the module, its sources, its recipe)
  # and the Go release. A library built by hand inside the module is not an input.
  ( cd "$here" && find "$1" -type f ! -name 'lib*.so*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    echo "$go_version" ) | sha256sum | cut -c1-16
}

cold_seconds() {  # cold_seconds NAME: the recipe's own estimate
  sed -n 's/^# cold: \([0-9]*\) s.*/\1/p' "$here/$1/build.sh" | head -1
}

declare -A keys=()
todo=()
for name in "${components[@]}"; do
  keys[$name]="$(key_of "$name")"
  [ -f "$cache/$name-${keys[$name]}/.complete" ] || todo+=("$name")
done
bindir_parts=()
for name in "${components[@]}"; do bindir_parts+=("$name-${keys[$name]}"); done
combined="$cache/bin-$(printf '%s\n' "${bindir_parts[@]}" | sha256sum | cut -c1-16)"

if [ "${#todo[@]}" = 0 ] && [ -f "$combined/.complete" ]; then  # warm: nothing to build, nothing to lock
  for part in "${bindir_parts[@]}"; do touch "$cache/$part/.used"; done
  touch "$combined/.used"
  echo "$combined"
  exit 0
fi
if [ "$print_only" = 1 ]; then
  echo "tools: ${todo[*]:-the bin directory} not built (run make tools)" >&2
  exit 1
fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! flock -n 9; then
  echo "tools: another build holds $cache/.lock; waiting for it ..." >&2
  flock 9
  todo=()  # what it built is not ours to build again
  for name in "${components[@]}"; do
    [ -f "$cache/$name-${keys[$name]}/.complete" ] || todo+=("$name")
  done
fi

if [ "${#todo[@]}" -gt 0 ]; then
  total=0
  for name in "${todo[@]}"; do total=$(( total + $(cold_seconds "$name") )); done
  cores="$(nproc 2>/dev/null || echo 2)"
  minutes=$(( (total * 2 / cores + 59) / 60 ))
  echo "tools: building ${#todo[@]} of ${#components[@]} components (${todo[*]}) into $cache:" \
       "about $minutes min on $cores cores from cold Go caches (less when Go's module and build caches are warm)" >&2
fi

n=0
for name in "${todo[@]}"; do
  n=$(( n + 1 ))
  dir="$cache/$name-${keys[$name]}"
  echo "tools: [$n/${#todo[@]}] $name (about $(cold_seconds "$name") s cold) ..." >&2
  start=$(date +%s)
  tmp="$cache/.tmp-$name-${keys[$name]}-$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  # Go's output (hundreds of "go: downloading" lines) goes to the component's .build.log; the terminal gets
  # a line a minute while it builds, and the log's tail if it fails.
  ( cd "$here/$name" && exec bash ./build.sh "$tmp" ) > "$tmp/.build.log" 2>&1 &
  pid=$!
  ticks=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ticks=$(( ticks + 1 ))
    [ $(( ticks % 60 )) = 0 ] && echo "tools: [$n/${#todo[@]}] $name still building ($(( $(date +%s) - start )) s)" >&2
  done
  if ! wait "$pid"; then
    echo "tools: $name failed; the end of $tmp/.build.log:" >&2
    tail -n 40 "$tmp/.build.log" >&2
    exit 1
  fi
  touch "$tmp/.complete"
  rm -rf "$dir"; mv "$tmp" "$dir"
  echo "tools: [$n/${#todo[@]}] $name built in $(( $(date +%s) - start )) s" >&2
done

# One directory that names every binary: symlinks into the per-component directories.
if [ ! -f "$combined/.complete" ]; then
  mkdir -p "$combined"
  for part in "${bindir_parts[@]}"; do
    for f in "$cache/$part"/*; do ln -sfn "$f" "$combined/$(basename "$f")"; done
  done
  touch "$combined/.complete"
fi
for part in "${bindir_parts[@]}"; do touch "$cache/$part/.used"; done
touch "$combined/.used"

# Pins no clone has used for KEEP_DAYS days (another clone on another commit may still use a recent one);
# a directory from before the stamps counts from its own time.
for d in "$cache"/*/; do
  d="${d%/}"
  stamp="$d/.used"; [ -e "$stamp" ] || stamp="$d"
  if [ -n "$(find "$stamp" -maxdepth 0 -mtime +"$KEEP_DAYS")" ]; then rm -rf "$d"; fi
done
find "$cache" -mindepth 1 -maxdepth 1 -name '.tmp-*' -mtime +1 -exec rm -rf {} + 2>/dev/null || true
du -sh "$cache" 2>/dev/null | awk '{print "tools: cache " $1 " in '"$cache"'"}' >&2
echo "$combined"
