"""Bash templates of the node-setup scripts; ``render.py`` fills the ``@@NAME@@`` markers.

Kept as plain text (not f-strings) so the bash reads as bash. Every host path is prefixed with
``$ROOT``; commands (nvidia-smi, modprobe, kubectl) come from PATH, which tests point at fakes.
"""

from __future__ import annotations

HEAD = r"""#!/usr/bin/env bash
# @@NAME@@: @@PURPOSE@@
# Rendered by nvgpu.nodescripts from the GPU catalogue; do not edit by hand.
# NVIDIA_GPU_ROOT (default "@@ROOT@@") prefixes every host path.
set -Eeuo pipefail

ROOT="${NVIDIA_GPU_ROOT-@@ROOT@@}"
ROOT="${ROOT%/}"
# shellcheck disable=SC2317  # fallbacks outside bashible; not every script logs at every level
if ! declare -F bb-log-info >/dev/null; then
  bb-log-info() { echo "INFO: $*" >&2; }
  bb-log-warning() { echo "WARNING: $*" >&2; }
  bb-log-error() { echo "ERROR: $*" >&2; }
fi

"""

STATE = r"""STATE_DIR="${ROOT}@@STATE_DIR@@"
VERDICT_FILE="${STATE_DIR}@@VERDICT_FILE@@"

"""

WRITE_FILE = r"""# write_file PATH < content: replace PATH atomically unless identical; prints changed|unchanged.
write_file() {
  local target="$1" tmp
  mkdir -p "$(dirname "$target")"
  tmp="$(mktemp "$(dirname "$target")/.$(basename "$target").XXXXXX")"
  cat >"$tmp"
  if [[ -f "$target" ]] && cmp -s "$tmp" "$target"; then
    rm -f "$tmp"
    echo unchanged
    return 0
  fi
  chmod 0644 "$tmp"
  sync "$tmp" 2>/dev/null || true
  mv -f "$tmp" "$target"
  echo changed
}

"""

NODE_LABEL = r"""node_name() {
  if declare -F bb-d8-node-name >/dev/null; then
    bb-d8-node-name
  else
    echo "${NODE_NAME:-$(hostname)}"
  fi
}

# node_label KEY VALUE: set a label on this node ("-" as VALUE removes it).
node_label() {
  local key="$1" value="$2" arg
  if [[ "$value" == "-" ]]; then arg="${key}-"; else arg="${key}=${value}"; fi
  if ! command -v kubectl >/dev/null 2>&1; then
    bb-log-warning "kubectl not found: cannot apply ${arg} to the node"
    return 0
  fi
  kubectl --kubeconfig "${ROOT}/etc/kubernetes/kubelet.conf" label node "$(node_name)" --overwrite "$arg" >/dev/null
}

"""

HAS_GPU = r"""# has_nvidia_gpu: an NVIDIA VGA or 3D controller is on the PCI bus.
has_nvidia_gpu() {
  local dev vendor class
  for dev in "${ROOT}@@PCI_DIR@@"/*; do
    [[ -r "${dev}/vendor" && -r "${dev}/class" ]] || continue
    vendor="$(<"${dev}/vendor")"
    class="$(<"${dev}/class")"
    if [[ "$vendor" == "@@NVIDIA_VENDOR@@" ]] && [[ @@CLASS_TEST@@ ]]; then
      return 0
    fi
  done
  return 1
}

# live_modules: "NAME " per module /sys/module lists as live (its initstate), the /proc/modules line's start,
# for a kernel without loadable-module support, which has no /proc/modules.
live_modules() {
  local state
  for state in "${ROOT}@@SYS_MODULE_DIR@@"/*/initstate; do
    [[ -r "$state" && "$(<"$state")" == live ]] || continue
    state="${state%/initstate}"
    echo "${state##*/} "
  done
}

"""

CONTAINERD_VERSION = r"""# containerd_version: config schema version (2 = containerd 1.x, 3 = 2.x); 0 without a config.
containerd_version() {
  local cfg="${ROOT}@@CONTAINERD_CONFIG@@" v
  if [[ ! -f "$cfg" ]]; then
    echo 0
    return 0
  fi
  v="$(sed -nE 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*([0-9]+)[[:space:]]*(#.*)?$/\1/p' "$cfg" | head -n1)"
  echo "${v:-1}"
}

"""

RUNTIME_DETECT = r"""# crio_markers: the CRI-O paths present (config, drop-in dir, binary, socket), one a line.
crio_markers() {
  local p
  if [[ -f "${ROOT}@@CRIO_CONFIG@@" ]]; then echo "@@CRIO_CONFIG@@"; fi
  if [[ -d "${ROOT}@@CRIO_DROPIN_DIR@@" ]]; then echo "@@CRIO_DROPIN_DIR@@"; fi
  for p in @@CRIO_BINARIES@@; do
    if [[ -f "${ROOT}${p}" ]]; then echo "$p"; fi
  done
  for p in @@CRIO_SOCKETS@@; do
    if [[ -e "${ROOT}${p}" ]]; then echo "$p"; fi
  done
  return 0
}

# container_runtime: containerd, crio, both or none (the agent decides from the same paths).
container_runtime() {
  local crio
  crio="$(crio_markers)"
  if [[ -e "${ROOT}@@CONTAINERD_CONFIG@@" ]]; then
    if [[ -n "$crio" ]]; then echo both; else echo containerd; fi
  elif [[ -n "$crio" ]]; then
    echo crio
  else
    echo none
  fi
}

"""

RUNTIME_READY = r"""# crio_ready: CRI-O has the nvidia runtime handler (and its binary) in crio.conf or a drop-in.
crio_ready() {
  local f files=()
  if [[ -f "${ROOT}@@CRIO_CONFIG@@" ]]; then files+=("${ROOT}@@CRIO_CONFIG@@"); fi
  for f in "${ROOT}@@CRIO_DROPIN_DIR@@"/*; do
    if [[ -f "$f" ]]; then files+=("$f"); fi
  done
  [[ ${#files[@]} -gt 0 ]] || return 1
  grep -Eq '^[[:space:]]*\[crio\.runtime\.runtimes\.@@RUNTIME@@\][[:space:]]*$' "${files[@]}" \
    && [[ -x "${ROOT}@@NCR@@" ]]
}

# containerd_files VERSION: config.toml and the drop-ins merged into it for that layout.
containerd_files() {
  local f dir
  [[ -f "${ROOT}@@CONTAINERD_CONFIG@@" ]] && echo "${ROOT}@@CONTAINERD_CONFIG@@"
  if [[ "$1" == 3 ]]; then dir="${ROOT}@@CONF2_D@@"; else dir="${ROOT}@@CONF_D@@"; fi
  for f in "$dir"/*.toml; do
    if [[ -f "$f" ]]; then echo "$f"; fi
  done
  return 0
}

# runtime_ready: containerd has the nvidia runtime (and its binary) or CDI enabled; CRI-O has the
# nvidia runtime (and its binary). Both runtimes or neither: not ready.
runtime_ready() {
  local version cri files=() kind
  kind="$(container_runtime)"
  if [[ "$kind" == crio ]]; then
    if crio_ready; then return 0; fi
    return 1
  fi
  [[ "$kind" == containerd ]] || return 1
  version="$(containerd_version)"
  case "$version" in
    2) cri="@@CRI2_RE@@" ;;
    3) cri="@@CRI3_RE@@" ;;
    *) return 1 ;;
  esac
  mapfile -t files < <(containerd_files "$version")
  [[ ${#files[@]} -gt 0 ]] || return 1
  local table="^[[:space:]]*\\[plugins\\.[\"']${cri}[\"']\\.containerd\\.runtimes\\.@@RUNTIME@@\\][[:space:]]*$"
  if grep -Eq "$table" "${files[@]}" && [[ -x "${ROOT}@@NCR@@" ]]; then
    return 0
  fi
  if grep -Eq '^[[:space:]]*enable_cdi[[:space:]]*=[[:space:]]*true' "${files[@]}"; then
    return 0
  fi
  if [[ "$version" == 3 ]] && ! grep -Eq '^[[:space:]]*enable_cdi[[:space:]]*=[[:space:]]*false' "${files[@]}"; then
    return 0
  fi
  return 1
}
"""

CHECK = r"""
PHASE="${NVIDIA_GPU_CHECK_PHASE:-@@PHASE@@}"
STRICT="${NVIDIA_GPU_CHECK_STRICT:-@@STRICT@@}"
GLOBAL_MIN_DRIVER="@@GLOBAL_MIN_DRIVER@@"
# The node group's declared driver (a release or a branch) and kernel modules (open or proprietary).
EXPECT_DRIVER="${NVIDIA_GPU_EXPECT_DRIVER-@@EXPECT_DRIVER@@}"
EXPECT_MODULES="${NVIDIA_GPU_EXPECT_MODULES-@@EXPECT_MODULES@@}"
# The declared driver type (gpu, vgpu, vgpu-host-manager), compared with the GPUs' virtualization mode.
EXPECT_DRIVER_TYPE="${NVIDIA_GPU_EXPECT_DRIVER_TYPE-@@EXPECT_DRIVER_TYPE@@}"
reasons=()

fail() {
  reasons+=("$1")
  bb-log-error "nvidia-gpu check: $1: $2"
}

# version_to_int 550.54.15 -> 550054015 (a missing patch counts as 0).
version_to_int() {
  local major minor patch
  IFS=. read -r major minor patch <<<"$1"
  echo $((10#${major} * 1000000 + 10#${minor} * 1000 + 10#${patch:-0}))
}

# model_min_driver DEVICE NAME: the catalogue's minimum driver for a GPU, by its PCI device ID (4 hex
# digits, upper case) first and its nvidia-smi product name failing that: names vary by driver and board.
model_min_driver() {
  case "$1" in
@@MODEL_PCI_CASES@@
  esac
  case "$2" in
@@MODEL_CASES@@
    *) return 1 ;;
  esac
}

finish() {
  local verdict="$1" csv=""
  if [[ ${#reasons[@]} -gt 0 ]]; then
    csv="$(printf '%s\n' "${reasons[@]}" | sort -u | paste -sd, -)"
  fi
  mkdir -p "$STATE_DIR"
  printf 'verdict=%s\nreasons=%s\ndriver=%s\n' "$verdict" "$csv" "${driver:-}" | write_file "$VERDICT_FILE" >/dev/null
  echo "nvidia-gpu-check verdict=${verdict} reasons=${csv}"
  if [[ "$verdict" != no-gpu ]]; then
    # The node's check labels, as the agent writes them (nvgpu.labels.check_labels): the verdict, and the
    # reasons .-joined, as many as fit a label value.
    local joined="${csv//,/.}"
    while ((${#joined} > 63)); do joined="${joined%.*}"; done
    node_label '@@CHECK_LABEL@@' "$verdict"
    node_label '@@CHECK_REASONS_LABEL@@' "${joined:--}"
  fi
  if [[ "$verdict" == unusable && "$STRICT" == true ]]; then
    exit 1
  fi
  exit 0
}

driver=""
if ! has_nvidia_gpu; then
  bb-log-info "nvidia-gpu check: no NVIDIA GPU on this node"
  finish no-gpu
fi

# The OS and kernel as Node Feature Discovery labels them, and whether the host has its own driver: a
# driver container is chosen by them and has to run before this check can pass (the agent's setup
# publishes the same, node_agent.host.osinfo).
label_value_ok() { [[ "$1" =~ ^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$ ]]; }
os_value() {
  local f
  for f in @@OS_RELEASE_FILES@@; do
    if [[ -r "${ROOT}${f}" ]]; then
      sed -nE "s/^$1=(\"?)([^\"]*)\1[[:space:]]*$/\2/p" "${ROOT}${f}" | head -n1
      return 0
    fi
  done
}
os_id="$(os_value ID)"
os_version_id="$(os_value VERSION_ID)"
kernel_release="$(cat "${ROOT}@@KERNEL_RELEASE_FILE@@" 2>/dev/null || true)"
# The host's own driver is labelled first: the OS labels are what place a driver container, so one can
# never land in between on a node whose host has a driver.
host_driver_markers=(@@HOST_DRIVER_MARKERS@@)
for marker in "${host_driver_markers[@]}"; do
  if [[ -e "${ROOT}${marker}" ]]; then
    node_label @@DEPLOY_DRIVER_LABEL@@ @@DRIVER_PREINSTALLED@@
    break
  fi
done
for pair in "@@OS_ID_LABEL@@=${os_id}" "@@OS_VERSION_LABEL@@=${os_version_id}" "@@KERNEL_LABEL@@=${kernel_release}"; do
  value="${pair#*=}"
  if [[ -n "$value" ]] && label_value_ok "$value"; then
    node_label "${pair%%=*}" "$value"
  fi
done

version_file="${ROOT}@@DRIVER_FILE@@"
if [[ ! -e "$version_file" ]]; then
  fail driver-missing "${version_file#"$ROOT"} is missing: the NVIDIA kernel driver is not loaded"
elif ! first_line="$(head -n1 "$version_file" 2>/dev/null)"; then
  fail proc-unreadable "cannot read ${version_file#"$ROOT"}"
else
  driver="$(printf '%s \n' "$first_line" \
    | sed -nE 's/.*Kernel Module( for [^[:space:]]+)?[[:space:]]+([0-9]+\.[0-9]+(\.[0-9]+)?)[[:space:]].*/\2/p')"
  if [[ -z "$driver" ]]; then
    fail driver-unparseable "cannot find a driver version in '${first_line}'"
  fi
fi

@@DRIVER_CHECKS@@
@@HOST_CHECKS@@
if ! command -v @@SMI@@ >/dev/null 2>&1; then
  fail nvml-failed "@@SMI@@ not found"
elif ! smi_out="$(timeout -k @@SMI_KILL@@ @@SMI_TIMEOUT@@ \
  @@SMI@@ --query-gpu=name,compute_cap,pci.device_id --format=csv,noheader 2>&1)"; then
  fail nvml-failed "@@SMI@@ failed: ${smi_out}"
else
  count=0
  min_driver="$GLOBAL_MIN_DRIVER"
  gpu_computes=""
  while IFS=, read -r name cc pci; do
    name="${name#"${name%%[![:space:]]*}"}"
    name="${name%"${name##*[![:space:]]}"}"
    cc="${cc//[[:space:]]/}"
    pci="${pci//[[:space:]]/}"
    pci="${pci^^}"
    device="${pci#0X}"
    device="${device:0:4}" # 0xDDDDVVVV: the device ID, then NVIDIA's vendor ID
    [[ -n "$name" ]] || continue
    count=$((count + 1))
    if model_min="$(model_min_driver "$device" "$name")"; then
      if (($(version_to_int "$model_min") > $(version_to_int "$min_driver"))); then
        min_driver="$model_min"
      fi
    else
      # Not a failure (node_agent.setup.check): a GPU nvidia-smi lists is a GPU; the global minimum applies.
      echo "nvidia-gpu-check notice: GPU model '${name}' (PCI device ID 0x${device:-?}) is not in the catalogue: \
the global minimum driver ${GLOBAL_MIN_DRIVER} applies" >&2
    fi
    gpu_computes+="${cc}|GPU '${name}'"$'\n'
  done <<<"$smi_out"
  if ((count == 0)); then
    fail no-gpus-listed "@@SMI@@ lists no GPU"
  fi
@@REQUIRED_DRIVER_CHECKS@@  queried=false
  if ((count > 0)); then
    if query="$(timeout -k @@SMI_KILL@@ @@SMI_TIMEOUT@@ @@SMI@@ -q 2>&1)"; then
      queried=true
    else
      fail nvml-failed "@@SMI@@ -q failed: ${query}"
    fi
  fi
  if [[ "$queried" == true ]]; then
    # The GPUs' NVLink fabric registration, as the agent reads NVML's (node_agent.setup.check._fabric).
    gpu_fabrics="$(awk '/^GPU / { bus = $2; fabric = 0; state = "" }
      /^    Fabric$/ { fabric = 1; next }
      fabric && /^        State / { sub(/^[^:]*: */, ""); state = $0; next }
      fabric && /^        Status / { sub(/^[^:]*: */, ""); print state "|" $0 "|GPU " bus; fabric = 0 }' <<<"$query")"
@@FABRIC_CHECKS@@    # The GPUs' virtualization modes, one a line (nvidia-smi -q words them as NVML names them).
    gpu_modes="$(sed -nE \
      's/^[[:space:]]*Virtualization Mode[[:space:]]*:[[:space:]]*(.*[^[:space:]])[[:space:]]*$/\1/p' <<<"$query")"
@@VIRTUALIZATION_CHECKS@@  fi
fi

if [[ "$PHASE" == all ]] && ! runtime_ready; then
  fail runtime-not-ready "the container runtime is not ready for GPUs ($(container_runtime): containerd needs \
the nvidia runtime or CDI, CRI-O the nvidia runtime)"
fi
if [[ "$PHASE" == all ]]; then
  # One of the toolkit's programs GPU containers are started with: under /usr/bin, or where a toolkit
  # container installed it (NVIDIA_GPU_TOOLKIT_DIR).
@@RUNTIME_CHECKS@@fi

if [[ ${#reasons[@]} -gt 0 ]]; then
  finish unusable
fi
finish ok
"""

TOOLKIT = r"""# toolkit_config: the NVIDIA toolkit's config edited as plan.toolkit_config says (our block on top, the
# root-table lines setting its keys disabled); the agent makes the same edit (node_agent.setup.executor).
# The driver root the toolkit's nvidia-container-cli must use: a driver container's, or empty for the host's /.
TOOLKIT_ROOT="${NVIDIA_GPU_TOOLKIT_ROOT-@@TOOLKIT_ROOT@@}"
toolkit_config() {
  local fact_driver_root="$TOOLKIT_ROOT" plan_result
@@TOOLKIT_PLAN@@
  bb-log-info "nvidia-gpu runtime: @@TOOLKIT_CONFIG@@ ${plan_result}"
}

"""

RUNTIME = r"""
if ! has_nvidia_gpu; then
  bb-log-info "nvidia-gpu runtime: no NVIDIA GPU on this node, the container runtime left alone"
  exit 0
fi
if grep -qx 'verdict=unusable' "$VERDICT_FILE" 2>/dev/null; then
  bb-log-error "nvidia-gpu runtime: the GPU check failed, the container runtime left alone (see gpu-check.sh)"
  exit 0
fi

# The facts plan.RUNTIME_DROPIN chooses from, detected here as the agent detects them (node_agent.setup.runtime).
fact_runtime="$(container_runtime)"
fact_crio_markers="$(crio_markers | paste -sd, - | sed 's/,/, /g')"
fact_containerd_version="$(containerd_version)"
fact_deckhouse=false
if [[ -f "${ROOT}@@DECKHOUSE_BASE@@" ]]; then fact_deckhouse=true; fi
fact_systemd_cgroup=false
if grep -Eq '^[[:space:]]*SystemdCgroup[[:space:]]*=[[:space:]]*true' "${ROOT}@@CONTAINERD_CONFIG@@" 2>/dev/null; then
  fact_systemd_cgroup=true
fi
fact_binary="@@NCR@@"
fact_nvidia_runtime=false
if [[ -x "${ROOT}${fact_binary}" ]]; then fact_nvidia_runtime=true; fi
fact_conmon=""
for p in @@CONMON_PATHS@@; do
  if [[ -f "${ROOT}${p}" && -x "${ROOT}${p}" ]]; then
    fact_conmon="$p"
    break
  fi
done

# runtime_refuse MESSAGE: the plan refuses this host (nothing was changed).
runtime_refuse() {
  bb-log-error "nvidia-gpu runtime: $1"
  exit 1
}
@@RUNTIME_PLAN@@
if [[ "$plan_result" == skipped ]]; then
  echo "nvidia-gpu-runtime runtime=${fact_runtime} dropin=${plan_path} result=skipped"
  exit 0
fi
if [[ "$fact_nvidia_runtime" == true ]]; then
  toolkit_config
fi
if [[ "$fact_runtime" == crio ]]; then
  # CRI-O is not managed by bashible: crio is restarted here. A restart, not a reload: SIGHUP re-reads only a
  # few options, not the runtimes table or default_runtime.
  if [[ "$plan_result" == changed ]]; then
    if ! command -v systemctl >/dev/null 2>&1; then
      bb-log-warning "nvidia-gpu runtime: systemctl not found: restart crio to apply the change"
    elif ! systemctl restart crio; then
      bb-log-warning "nvidia-gpu runtime: systemctl restart crio failed"
    fi
  fi
  bb-log-info "nvidia-gpu runtime: ${plan_path} ${plan_result}"
  echo "nvidia-gpu-runtime runtime=crio dropin=${plan_path} result=${plan_result}"
  exit 0
fi
bb-log-info "nvidia-gpu runtime: ${plan_path} ${plan_result}"
echo "nvidia-gpu-runtime runtime=containerd containerd=${fact_containerd_version} dropin=${plan_path} \
result=${plan_result}"
"""

SYSCTL = r"""
if ! has_nvidia_gpu; then
  node_label "@@SETUP_LABEL@@" -
  bb-log-info "nvidia-gpu sysctl: no NVIDIA GPU on this node"
  exit 0
fi

verdict="$(sed -n 's/^verdict=//p' "$VERDICT_FILE" 2>/dev/null || true)"
if [[ "$verdict" == unusable ]]; then
  node_label "@@SETUP_LABEL@@" -
  bb-log-error "nvidia-gpu sysctl: the GPU check failed; @@SETUP_LABEL@@ removed, sysctls left alone"
  echo "nvidia-gpu-setup complete=false verdict=unusable"
  exit 0
fi

# plan_refuse MESSAGE: a file of the plan's is someone else's; nothing was changed, the gate stays closed.
plan_refuse() {
  node_label "@@SETUP_LABEL@@" -
  bb-log-error "nvidia-gpu sysctl: $1"
  echo "nvidia-gpu-setup complete=false verdict=${verdict:-none}"
  exit 1
}
@@SYSCTL_PLAN@@
if [[ "$verdict" == ok ]] && runtime_ready; then
  node_label "@@SETUP_LABEL@@" ""
  echo "nvidia-gpu-setup complete=true"
else
  node_label "@@SETUP_LABEL@@" -
  bb-log-error "nvidia-gpu sysctl: GPU node not ready (check verdict: ${verdict:-none}); @@SETUP_LABEL@@ removed"
  echo "nvidia-gpu-setup complete=false verdict=${verdict:-none}"
fi
"""

VFIO = r"""
if ! has_nvidia_gpu; then
  node_label "@@VFIO_LABEL@@" -
  exit 0
fi

@@VFIO_PLAN@@
if [[ ${#plan_problems[@]} -eq 0 ]]; then
  node_label "@@VFIO_LABEL@@" "true"
  echo "nvidia-gpu-vfio ready=true problems="
else
  node_label "@@VFIO_LABEL@@" -
  csv="$(printf '%s\n' "${plan_problems[@]}" | paste -sd, -)"
  bb-log-error "nvidia-gpu vfio: not ready: ${csv}"
  echo "nvidia-gpu-vfio ready=false problems=${csv}"
fi
"""

DEVICES = r"""
# A freshly booted node has the driver loaded but not nvidia_uvm (the first CUDA program's nvidia-modprobe
# loads it), and no /dev/nvidia* node: the nvidia module registers its majors in /proc/devices but makes no
# node. NVIDIA's stack makes them itself (nvidia-ctk system create-device-nodes --control-devices
# --load-kernel-modules); so does this step, before gpu-check.sh, as the agent's setup does before its check:
# what is loaded and made is nvgpu.nodescripts.plan.DEVICES, rendered below, which the agent applies too
# (node_agent.setup.devnodes). This frame holds the lock and the journal: every node is recorded in the agent's
# setup journal before it is made, so a teardown removes exactly those.
STRICT="${NVIDIA_GPU_CHECK_STRICT:-@@STRICT@@}"
STATE_DIR="${ROOT}@@STATE_DIR@@"
JOURNAL="${ROOT}@@DEVNODES_JOURNAL@@"
plan_loaded=()
plan_made=()

# finish_devices RESULT: the result line (the modules loaded, the nodes made), then the script's exit.
finish_devices() {
  local loaded="" made=""
  if [[ ${#plan_loaded[@]} -gt 0 ]]; then loaded="$(IFS=,; echo "${plan_loaded[*]}")"; fi
  if [[ ${#plan_made[@]} -gt 0 ]]; then made="$(IFS=,; echo "${plan_made[*]}")"; fi
  echo "nvidia-gpu-devices result=$1 loaded=${loaded} made=${made}"
  if [[ "$1" == failed && "$STRICT" == true ]]; then exit 1; fi
  exit 0
}

# fail_devices MESSAGE: not strict, the node is left to gpu-check.sh, which finds what is missing and closes
# the gate; the message is the plan's, as the agent's setup words it (its devices step).
fail_devices() {
  bb-log-error "@@DEVICES_LOG@@: $1"
  finish_devices failed
}

if ! has_nvidia_gpu; then
  bb-log-info "@@DEVICES_LOG@@: no NVIDIA GPU on this node"
  exit 0
fi

mkdir -p "$STATE_DIR"
# The agent's lock (flock(2) on the same file, node_agent.host.root.HostRoot.lock): never both at once.
if command -v flock >/dev/null 2>&1; then
  (umask 077 && : >>"${ROOT}@@DEVNODES_LOCK@@")
  exec 9>>"${ROOT}@@DEVNODES_LOCK@@"
  if ! flock -w 60 9; then
    fail_devices "another agent process holds @@DEVNODES_LOCK@@"
  fi
fi

# The journal: node_agent.setup.journal's manifest (model_dump_json(indent=1), written 0600 atomically),
# holding only nodes made (existed: false) and the directories made for them, as the agent records them.
journal_paths=()
journal_dirs=()
journal_text() {
  local i n sep
  printf '{\n "version": 1,\n'
  n=${#journal_paths[@]}
  if ((n == 0)); then printf ' "files": [],\n'; else
    printf ' "files": [\n'
    for ((i = 0; i < n; i++)); do
      sep=","
      if ((i == n - 1)); then sep=""; fi
      printf '  {\n   "path": "%s",\n   "existed": false,\n   "mode": 420,\n   "content_b64": ""\n  }%s\n' \
        "${journal_paths[i]}" "$sep"
    done
    printf ' ],\n'
  fi
  n=${#journal_dirs[@]}
  if ((n == 0)); then printf ' "created_dirs": [],\n'; else
    printf ' "created_dirs": [\n'
    for ((i = 0; i < n; i++)); do
      sep=","
      if ((i == n - 1)); then sep=""; fi
      printf '  "%s"%s\n' "${journal_dirs[i]}" "$sep"
    done
    printf ' ],\n'
  fi
  printf ' "added_items": [],\n "written": {}\n}'
}
# journal_open: what the journal holds already; anything else in it (a file it copied, another layout) is the
# agent's to undo, not this script's to rewrite.
journal_open() {
  if [[ -f "$JOURNAL" ]]; then
    mapfile -t journal_paths < <(sed -nE 's/^   "path": "([^"\\]*)",$/\1/p' "$JOURNAL")
    mapfile -t journal_dirs < <(awk '/^ "created_dirs": \[$/ { d = 1; next } d && /^ \]/ { d = 0 }
      d { sub(/^  "/, ""); sub(/",?$/, ""); print }' "$JOURNAL")
    if [[ "$(journal_text)" != "$(cat "$JOURNAL")" ]]; then
      fail_devices "the rollback journal ${JOURNAL#"$ROOT"} is not one this script wrote or can extend: \
the agent's teardown (node_agent teardown) undoes it; no device node made"
    fi
  fi
}
# journal_record PATH: remember PATH (and the directories about to be made for it) before it is made.
journal_record() {
  local p parent tmp
  for p in "${journal_paths[@]}"; do
    if [[ "$p" == "$1" ]]; then return 0; fi
  done
  journal_paths+=("$1")
  parent="$(dirname "$1")"
  while [[ ! -e "${ROOT}${parent}" ]]; do
    local seen=false
    for p in "${journal_dirs[@]}"; do
      if [[ "$p" == "$parent" ]]; then seen=true; fi
    done
    if [[ "$seen" != true ]]; then journal_dirs+=("$parent"); fi
    parent="$(dirname "$parent")"
  done
  mkdir -p "$(dirname "$JOURNAL")"
  tmp="$(mktemp "$(dirname "$JOURNAL")/.manifest.json.XXXXXX")"
  journal_text >"$tmp"
  chmod 0600 "$tmp"
  sync "$tmp" 2>/dev/null || true
  mv -f "$tmp" "$JOURNAL"
}

@@DEVICES_PLAN@@
if [[ ${#plan_made[@]} -gt 0 ]]; then
  bb-log-info "@@DEVICES_LOG@@: made $(IFS=,; echo "${plan_made[*]}")"
fi
finish_devices ok
"""
