"""Step 6: every manifest through a real kube-apiserver by server-side apply with ``dryRun=All``.

Schemas cannot see what only the API server checks (its validation rules, admission, CEL compiling,
namespaces and patch targets that must exist), so the preview asks one:

- ``--server-dry-run KUBECONFIG``: the user's own cluster; nothing is written (a missing namespace or
  NodeGroup the stack needs is a finding);
- otherwise, when the pinned control plane is built (``make tools``), a throwaway etcd and
  kube-apiserver on loopback, started for this run and removed after it, with the stack's
  preconditions created first and listed;
- otherwise schema validation is all there is, and the report says so.

A refused object is a problem naming the manifest, with the server's message verbatim.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from localcluster import ControlPlane, Kube, ToolsMissing, tools_bin
from localcluster.client import APPLY_FIELD_MANAGER, ApiError
from localcluster.dryrun import FIELD_MANAGER, PRECONDITIONS_MANAGER, DryRunReport, Item, dry_run, install_crds
from nvidia_gpu.preview import crds
from nvidia_gpu.preview.background import BackgroundStart
from nvidia_gpu.preview.model import PreviewResult, Problem

STEP = "server-dry-run"
log = logging.getLogger(__name__)


_HANDOFF = "server-dry-run"


class StartingControlPlane(BackgroundStart[ControlPlane]):
    """The throwaway control plane, started on a thread while the program registers and the schemas
    validate (its start, about 5 s, used to come strictly after everything else); closing it stops it
    and removes its directory."""

    def __init__(self, bin_dir: Path) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="nvgpu-dryrun-")
        self.cp = ControlPlane(directory=Path(self._tmp.name), components=("etcd", "kube-apiserver"), bin_dir=bin_dir)
        super().__init__("dry-run-control-plane", lambda: self.cp.start(timeout=90), self._stop)

    def _stop(self) -> None:
        self.cp.stop(remove=False)
        self._tmp.cleanup()


def start(result: PreviewResult) -> None:
    """Right after the config: start the throwaway control plane the dry-run step will use, if it will."""
    if result.server_mode == "off" or result.server_kubeconfig is not None:
        return
    try:
        bin_dir = tools_bin()
    except ToolsMissing:
        return  # the step says why
    result.handoff[_HANDOFF] = StartingControlPlane(bin_dir)


def run(result: PreviewResult) -> None:
    starting = result.handoff.pop(_HANDOFF, None)
    try:
        _run(result, starting if isinstance(starting, StartingControlPlane) else None)
    finally:
        if starting is not None:
            starting.close()


def _run(result: PreviewResult, starting: StartingControlPlane | None) -> None:
    if result.server_mode == "off" or not result.manifests:
        return
    items = [Item(m.filename, m.object, m.patch) for m in result.manifests]
    if result.server_kubeconfig is not None:
        try:
            kube = Kube.from_kubeconfig(result.server_kubeconfig, result.server_context)
            report = dry_run(kube, items, ephemeral=False)
        except (ApiError, OSError, ValueError) as e:
            result.problems.append(Problem(STEP, str(result.server_kubeconfig), f"cannot dry-run there: {e}"))
            return
        _record(result, report, "your cluster (nothing written)")
        for label, message in collisions(kube, items):
            result.problems.append(Problem(STEP, label, message))
        return
    if starting is None:
        try:
            starting = StartingControlPlane(tools_bin())
        except ToolsMissing as e:
            result.report_sections.append(f"Server dry-run: skipped, schema validation only ({e}).")
            return
    try:
        cp = starting.wait()
        kube = cp.admin()
        groups = {m.api_version.split("/")[0] for m in result.manifests if "/" in m.api_version}
        install_crds(kube, [p for p in sorted(crds.CRD_DIR.glob("*.yaml"))
                            if p.name.split(".", 1)[1].removesuffix(".yaml") in groups])
        report = dry_run(kube, items, ephemeral=True, placeholder=deckhouse_placeholder)
    except (RuntimeError, TimeoutError, ApiError, OSError) as e:
        result.problems.append(Problem(STEP, "local control plane", f"could not run the dry-run: {e}"))
        return
    finally:
        starting.close()
    _record(result, report, f"a throwaway control plane, up in {cp.startup_s:.1f} s")


#: Field managers of this project's objects: the provider's default (``pulumi-kubernetes-<random>``) and
#: the stable one of our NodeGroup patches (``nvidia-gpu.<namespace>``), by prefix; the harness's own
#: (``localcluster``: dry runs, preconditions, stacks the tests apply), by name. Nothing broader: another
#: vendor's ``nvidia-gpu-…`` manager is not ours.
OUR_MANAGER_PREFIXES = ("pulumi-kubernetes-", "nvidia-gpu.")
OUR_MANAGERS = (FIELD_MANAGER, PRECONDITIONS_MANAGER, APPLY_FIELD_MANAGER)


def _ours(manager: str) -> bool:
    return manager.startswith(OUR_MANAGER_PREFIXES) or manager in OUR_MANAGERS


def collisions(kube: Kube, items: list[Item]) -> list[tuple[str, str]]:
    """Objects the stack would create that already exist and were not made by Pulumi or this project.

    In server-side-apply mode the provider applies over an existing object instead of failing, so a
    fixed-name object of someone else's (NVIDIA's DRA driver's DeviceClass ``gpu.nvidia.com``, a
    RuntimeClass ``nvidia``) would silently become the stack's, and ``pulumi destroy`` would delete it.
    """
    found: list[tuple[str, str]] = []
    for item in items:
        if item.patch:
            continue
        obj = item.object
        meta = obj.get("metadata", {})
        try:
            live = kube.get_or_none(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        except ApiError:
            continue  # a kind or namespace the cluster lacks: the dry-run reports it
        if live is None:
            continue
        managers = sorted({m.get("manager", "?") for m in live["metadata"].get("managedFields") or []})
        if any(_ours(m) for m in managers):
            continue
        where = f" in namespace {meta['namespace']}" if meta.get("namespace") else ""
        found.append((item.label, f"{obj['kind']} {meta['name']}{where} already exists, managed by "
                                  f"{', '.join(managers) or 'an unknown manager'}: `pulumi up` would take it over "
                                  "and `pulumi destroy` would delete it; remove it first, or turn this stack's "
                                  "off where the stack config allows (cluster.runtimeClass.create, "
                                  "cluster.dra.createDeviceClasses)"))
    return found


def deckhouse_placeholder(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The Deckhouse NodeGroup the stack patches, minimal and valid, as Deckhouse's users create it
    before the stack runs (the stack only patches ``spec.nodeTemplate``); None for any other kind."""
    if obj.get("apiVersion", "").startswith("deckhouse.io/") and obj.get("kind") == "NodeGroup":
        return {"apiVersion": obj["apiVersion"], "kind": "NodeGroup",
                "metadata": {"name": obj["metadata"]["name"]}, "spec": {"nodeType": "Static"}}
    return None


def _record(result: PreviewResult, report: DryRunReport, where: str) -> None:
    for label, message in report.refused:
        result.problems.append(Problem(STEP, label, f"refused by kube-apiserver {report.version}: {message}"))
    for label, message in report.missing:
        result.problems.append(Problem(STEP, label, f"missing in the cluster: {message}"))
    lines = [f"Server dry-run ({where}): {report.checked - len(report.refused)} of {report.checked} objects "
             f"accepted by kube-apiserver {report.version}."]
    stack_minor = result.config.cluster.kubernetes_version if result.config else None
    server_minor = ".".join(report.version.lstrip("v").split(".")[:2])
    if stack_minor and stack_minor != server_minor:
        lines.append(f"  note: the stack targets Kubernetes {stack_minor}; the server is {server_minor} "
                     f"(schemas above are {stack_minor}'s)")
    lines += [f"  precondition: {p}" for p in report.preconditions]
    lines += [f"  not checked: {label}: {why}" for label, why in report.skipped]
    lines += [f"  warning: {label}: {text}" for label, text in report.warnings]
    result.report_sections.append("\n".join(lines))
