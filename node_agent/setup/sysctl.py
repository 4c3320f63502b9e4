"""``sysctl apply|rollback``: ``net.core.bpf_jit_harden=1`` through our own ``/etc/sysctl.d`` drop-in,
applied live. The Python twin of the sysctl half of ``gpu-sysctl.sh``.

The live value before our first apply is kept in ``/var/lib/nvidia-gpu-agent/sysctl.previous``
(``name=value`` lines, the same file the script writes), and the drop-in is journaled, so rollback
puts both the live value and ``/etc`` back as they were.

The drop-in is ``/etc/sysctl.d/99-zz-nvidia-gpu.conf``. At boot systemd-sysctl reads every
``*.conf`` of ``/etc/sysctl.d``, ``/run/sysctl.d`` and ``/usr/lib/sysctl.d`` in the lexicographic
order of the *file name*, and a later assignment wins. Debian and Ubuntu ship
``/etc/sysctl.d/99-sysctl.conf -> ../sysctl.conf``; the former name ``99-nvidia-gpu.conf`` sorts
before it (``n`` < ``s``), so a distribution's ``net.core.bpf_jit_harden=2`` won again at boot.
``99-zz-`` keeps the two-digit prefix sysctl.d(5) recommends, sorts after ``99-sysctl.conf`` and
every other ``99-<letter>`` file a distribution ships, and still leaves an administrator a later
name (``zz-*.conf``) to override us deliberately.

Migration: apply removes a drop-in under a former name when it carries our header (only then is
it ours; a foreign file under that name is left alone), after journaling it, so rollback puts it
back byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from node_agent.host import HostRoot, NotOurs, nvidia_gpus
from node_agent.setup.journal import Journal
from nvgpu.nodescripts import facts
from nvgpu.nodescripts.content import HEADER, sysctl_dropin

PREVIOUS_FILE = f"{facts.STATE_DIR}/sysctl.previous"
#: Our drop-in: the same name as the Deckhouse ``gpu-sysctl.sh`` writes (one source, ``facts``).
DROPIN = facts.SYSCTL_DROPIN
#: Names the drop-in had before; apply migrates them (removes ours, journaled).
FORMER_DROPINS: tuple[str, ...] = facts.SYSCTL_FORMER_DROPINS


@dataclass
class SysctlResult:
    skipped: str | None = None
    changed_files: list[str] = field(default_factory=list)
    live: dict[str, str] = field(default_factory=dict)  #: name → value written now
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "changedFiles": self.changed_files, "live": self.live, "notes": self.notes}


def _previous(host: HostRoot) -> dict[str, str]:
    text = host.read_text_or_none(PREVIOUS_FILE) or ""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name not in out:
            out[name.strip()] = value.strip()
    return out


def apply_sysctl(host: HostRoot) -> SysctlResult:
    if not nvidia_gpus(host):
        return SysctlResult(skipped="no-gpu")
    with host.lock("sysctl"):
        return _apply_sysctl(host)


def _apply_sysctl(host: HostRoot) -> SysctlResult:
    result = SysctlResult()
    existing = host.read_text_or_none(DROPIN)
    if existing is not None and not existing.startswith(HEADER):
        raise NotOurs(f"{DROPIN} exists and was not written by nvidia-gpu; not overwriting it", DROPIN)
    current: dict[str, str] = {}
    for name in facts.SYSCTLS:
        path = facts.sysctl_proc_path(name)
        text = host.read_text_or_none(path)
        if text is None:
            result.notes.append(f"{name} does not exist on this kernel")
        else:
            current[name] = text.strip()
    content = sysctl_dropin()
    journal = Journal(host, "sysctl")
    if existing != content:
        journal.record(DROPIN)
        host.write_atomic(DROPIN, content)
        result.changed_files.append(DROPIN)
    for former in FORMER_DROPINS:
        text = host.read_text_or_none(former)
        if text is None:
            continue
        if not text.startswith(HEADER):
            result.notes.append(f"{former} was not written by nvidia-gpu; left alone")
            continue
        journal.record(former)  # the new drop-in is in place first: no window without the setting
        if host.remove(former):
            result.changed_files.append(former)
    previous = _previous(host)
    missing = {n: v for n, v in current.items() if n not in previous}
    if missing:
        text = host.read_text_or_none(PREVIOUS_FILE) or ""
        host.write_atomic(PREVIOUS_FILE, text + "".join(f"{n}={v}\n" for n, v in missing.items()))
    for name, value in current.items():
        want = facts.SYSCTLS[name]
        if value != want:
            host.write_kernel(facts.sysctl_proc_path(name), want + "\n")
            result.live[name] = want
    return result


def rollback_sysctl(host: HostRoot) -> SysctlResult:
    with host.lock("sysctl"):
        return _rollback_sysctl(host)


def _rollback_sysctl(host: HostRoot) -> SysctlResult:
    result = SysctlResult()
    result.changed_files = Journal(host, "sysctl").restore()
    # Ours without a journal entry (journal lost): remove it too. Former names are left to the
    # journal, which restores them when apply migrated them away.
    text = host.read_text_or_none(DROPIN)
    if text is not None and text.startswith(HEADER) and host.remove(DROPIN):
        result.changed_files.append(DROPIN)
    for name, value in _previous(host).items():
        path = facts.sysctl_proc_path(name)
        live = host.read_text_or_none(path)
        if live is None:
            result.notes.append(f"{name} does not exist on this kernel; previous value {value} not restored")
            continue
        if live.strip() != value:
            host.write_kernel(path, value + "\n")
            result.live[name] = value
    host.remove(PREVIOUS_FILE)
    return result
