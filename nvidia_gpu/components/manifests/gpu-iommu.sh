#!/usr/bin/env bash
# gpu-iommu.sh: IOMMU kernel parameters for GPU passthrough (DRA devices of class vfio.gpu.nvidia.com).
#
# Idempotent. Adds intel_iommu=on or amd_iommu=on (by CPU vendor) and iommu=pt to the kernel command line:
# a GRUB drop-in (Debian/Ubuntu grub.d) or grubby (RHEL family), then asks bashible for a reboot, but only
# while the running kernel lacks them. gpu-vfio.sh (weight 35) then checks the IOMMU and loads vfio.
# $NVIDIA_GPU_ROOT prefixes every host path (tests run against a fake root and never touch the bootloader).
set -Eeuo pipefail

root="${NVIDIA_GPU_ROOT:-}"
log() { echo "nvidia-gpu-iommu: $*"; }

cpuinfo="$(cat "${root}/proc/cpuinfo")"
case "$cpuinfo" in
  *GenuineIntel*) vendor_param="intel_iommu=on" ;;
  *AuthenticAMD*) vendor_param="amd_iommu=on" ;;
  *) log "unknown CPU vendor: IOMMU parameters not managed"; exit 0 ;;
esac
wanted=("$vendor_param" "iommu=pt")

cmdline=" $(cat "${root}/proc/cmdline") "
missing=()
for param in "${wanted[@]}"; do
  case "$cmdline" in
    *" $param "*) ;;
    *) missing+=("$param") ;;
  esac
done

dropin="${root}/etc/default/grub.d/90-nvidia-gpu-iommu.cfg"
content="GRUB_CMDLINE_LINUX_DEFAULT=\"\${GRUB_CMDLINE_LINUX_DEFAULT:-} ${wanted[*]}\""
changed=0
if [[ ! -f "$dropin" || "$(cat "$dropin")" != "$content" ]]; then
  mkdir -p "$(dirname "$dropin")"
  printf '%s\n' "$content" > "${dropin}.tmp"
  mv "${dropin}.tmp" "$dropin"
  changed=1
fi
if [[ -z "$root" && ( "$changed" == 1 || ${#missing[@]} -gt 0 ) ]]; then
  if command -v grubby >/dev/null 2>&1; then
    timeout 60 grubby --update-kernel=ALL --args="${wanted[*]}"
  elif command -v update-grub >/dev/null 2>&1; then
    timeout 120 update-grub
  elif command -v grub2-mkconfig >/dev/null 2>&1; then
    timeout 120 grub2-mkconfig -o /boot/grub2/grub.cfg
  else
    log "no grubby, update-grub or grub2-mkconfig: add ${wanted[*]} to the kernel command line by hand"
  fi
fi

if (( ${#missing[@]} > 0 )); then
  log "kernel command line lacks ${missing[*]}: reboot required"
  if declare -F bb-flag-set >/dev/null; then
    bb-flag-set reboot
  fi
else
  log "IOMMU parameters active (${wanted[*]})"
fi
