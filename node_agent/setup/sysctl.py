"""``sysctl apply|rollback``: ``net.core.bpf_jit_harden=1`` through our own ``/etc/sysctl.d`` drop-in,
applied live: the step's plan (``nvgpu.nodescripts.plan.SYSCTL``) applied by the agent's executor
(``node_agent.setup.executor``); ``gpu-sysctl.sh`` runs the same plan rendered as bash.

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

from node_agent.host import HostRoot, nvidia_gpus
from node_agent.setup.executor import apply_plan, rollback_plan
from nvgpu.nodescripts import facts, plan

PREVIOUS_FILE = facts.SYSCTL_PREVIOUS
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


def apply_sysctl(host: HostRoot) -> SysctlResult:
    if not nvidia_gpus(host):
        return SysctlResult(skipped="no-gpu")
    with host.lock("sysctl"):
        done = apply_plan(host, plan.SYSCTL)
    return SysctlResult(changed_files=done.changed_files, live=done.live, notes=done.notes)


def rollback_sysctl(host: HostRoot) -> SysctlResult:
    with host.lock("sysctl"):
        done = rollback_plan(host, plan.SYSCTL)
    return SysctlResult(changed_files=done.changed_files, live=done.live, notes=done.notes)
