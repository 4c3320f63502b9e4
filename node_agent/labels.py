"""``labels``: GPU feature-discovery labels, as an NFD local feature file and (``--patch-node``) on the Node.

One run (or, with ``--loop``, one run every ``--interval`` seconds until SIGTERM): read the GPUs
through NVML, compute the labels (``node_agent.gfd``), replace the feature file
(``/etc/kubernetes/node-feature-discovery/features.d/gfd``, atomically, only when it changed) and,
when asked, merge-patch the Node: set what changed and delete ``nvidia.com/*`` labels we own that
no longer apply. A node without an NVIDIA GPU gets only the timestamp and ``vgpu.present=false``.

With ``--patch-node`` the same patch also carries the node group's own labels and taints
(``--node-label KEY=VALUE``, ``--node-taint KEY=VALUE:EFFECT``; rules in ``node_agent.nodeconfig``),
which is how they reach nodes on clusters without Deckhouse node templates. Those are applied even
when NVML fails, so a broken GPU never leaves a node untainted.

Run by the stack's DaemonSet (``--daemonset NAMESPACE/NAME``), the labeller also owns the way out. It
patches only while the Node carries ``gpu-setup-complete`` (its DaemonSet's own gate), with the Node's
``resourceVersion`` in every patch, so a teardown that removed the gate meanwhile wins (409, re-read,
nothing written). And on SIGTERM it asks whether that DaemonSet is gone or being deleted (its group
was removed, its stack destroyed): then it takes off what it put on (:func:`withdraw`): the GFD
labels, the group's labels and taints it owns, the feature file. A restart for a new image leaves them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from node_agent import exitcodes, gfd
from node_agent.context import AgentContext, UsageError
from node_agent.host import HostError, nvidia_gpus
from node_agent.nodeconfig import NodeConfigError, NodePlan, Requested, plan
from node_agent.nvml import GpuInstanceProfile, NvmlError
from nvgpu import labels as label_names

log = logging.getLogger(__name__)
FEATURE_FILE = f"{label_names.NFD_FEATURES_DIR}/gfd"
DMI_PRODUCT = "/sys/class/dmi/id/product_name"
#: Re-reads after a 409 (the Node changed between read and patch) before the run reports the conflict.
CONFLICT_ATTEMPTS = 3


@dataclass(frozen=True)
class Owner:
    """The DaemonSet this labeller runs under (``--daemonset NAMESPACE/NAME``)."""

    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str) -> Owner:
        """The flag's value (argparse ``type``): a malformed one is a usage error naming it."""
        namespace, slash, name = text.partition("/")
        if not slash or not namespace or not name or "/" in name:
            raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}")
        return cls(namespace, name)


@dataclass(frozen=True)
class LabelRun:
    labels: dict[str, str]
    file_changed: bool
    node_changes: dict[str, str | None]
    warnings: tuple[str, ...] = ()
    #: The Node's new taint list when this run changed it.
    node_taints: tuple[dict[str, Any], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"labels": self.labels, "fileChanged": self.file_changed, "nodeChanges": self.node_changes,
                "nodeTaints": None if self.node_taints is None else list(self.node_taints),
                "warnings": list(self.warnings)}


def collect(ctx: AgentContext, args: argparse.Namespace) -> tuple[dict[str, str], tuple[str, ...]]:
    host = ctx.host
    on_bus = nvidia_gpus(host)
    classes = {d.pci_class[:6] for d in on_bus}
    mode = "compute" if classes == {"0x0302"} else "graphics" if classes == {"0x0300"} else "unknown"
    settings = gfd.LabelSettings(
        mig_strategy=args.mig_strategy, replicas=args.replicas, sharing_strategy=args.sharing_strategy,
        machine=(host.read_text_or_none(DMI_PRODUCT) or "").strip() or None, gpu_mode=mode,
        timestamp=None if args.no_timestamp else int(time.time()),
    )
    if not on_bus:
        return gfd.compute_labels([], None, {}, settings), ()
    with ctx.nvml() as nvml:
        inventory = nvml.inventory()
        driver = nvml.driver()
        profiles: dict[int, tuple[GpuInstanceProfile, ...]] = {
            g.index: nvml.gpu_instance_profiles(g.index) for g in inventory.gpus if g.mig_enabled}
    warnings = tuple(f"GPU {lost.index} left out: {lost.reason}" for lost in inventory.lost)
    return gfd.compute_labels(inventory.gpus, driver, profiles, settings), warnings


def label_once(ctx: AgentContext, args: argparse.Namespace, want: Requested) -> LabelRun:
    failure: NvmlError | HostError | None = None
    try:
        labels, warnings = collect(ctx, args)
    except (NvmlError, HostError) as e:
        if not args.patch_node:
            raise
        # The group's labels and taints do not depend on the GPUs: apply them anyway, then report.
        labels, warnings, failure = {}, (), e
    changed = False
    if failure is None and not args.no_output_file:
        changed = ctx.host.write_atomic(args.output_file, gfd.feature_file(labels))
    changes: dict[str, str | None] = {}
    taints: tuple[dict[str, Any], ...] | None = None
    if args.patch_node:
        changes, taints = patch_node(ctx, want, None if failure else labels, gated=args.daemonset is not None)
    if failure is not None:
        log.warning("node labels applied without GPU labels changes=%d error=%r", len(changes), str(failure))
        raise failure
    return LabelRun(labels, changed, changes, warnings, taints)


def patch_node(ctx: AgentContext, want: Requested, gpu_labels: dict[str, str] | None, *, gated: bool = False
               ) -> tuple[dict[str, str | None], tuple[dict[str, Any], ...] | None]:
    """One merge patch of the Node: GFD label changes (unless ``gpu_labels`` is None) plus the node config.

    Retried from a fresh read when the Node changed underneath (409 on the resourceVersion, sent with a
    new taint list and, when ``gated``, always). ``gated``: write nothing unless the Node carries
    ``gpu-setup-complete``.
    """
    from node_agent.kube import KubeError
    from node_agent.nodepatch import apply_plan, snapshot

    node = ctx.require_node_name()
    api = ctx.node_api()
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        snap = snapshot(api, node)
        if gated and label_names.GPU_SETUP_COMPLETE not in snap.labels:
            log.info("node setup is not complete (or was undone): not labelling node=%s", node)
            return {}, None
        config = plan(snap, want)
        label_patch = gfd.label_changes(snap.labels, gpu_labels) if gpu_labels is not None else {}
        label_patch |= config.labels
        full = NodePlan(label_patch, config.annotations, config.taints)
        if full.empty:
            return {}, None
        try:
            apply_plan(api, node, full, snap.resource_version if gated or full.taints is not None else "")
        except KubeError as e:
            if e.status != 409 or attempt == CONFLICT_ATTEMPTS:
                raise
            log.info("node changed while patching, re-reading node=%s attempt=%d", node, attempt)
            continue
        return label_patch, full.taints
    raise AssertionError("unreachable: the last attempt returns or raises")


def withdraw(ctx: AgentContext, feature_file: str = FEATURE_FILE) -> dict[str, str | None]:
    """Take off everything the labeller put on: the GFD labels, the node-group labels and taints it owns
    (and their ownership annotations), and the feature file. Foreign labels and taints stay."""
    changes, _ = patch_node(ctx, Requested(), {})
    ctx.host.remove(feature_file)
    return changes


def _withdraw_if_retired(ctx: AgentContext, owner: Owner, feature_file: str) -> None:
    from node_agent.kube import KubeError

    try:
        if not ctx.node_api().daemonset_retired(owner.namespace, owner.name):
            return
        changes = withdraw(ctx, feature_file)
    except (HostError, KubeError) as e:  # the pod is stopping: report and exit
        log.warning("could not withdraw the labels daemonset=%s/%s error=%r", owner.namespace, owner.name, str(e))
        return
    log.info("daemonset retired, labels withdrawn daemonset=%s/%s node_changes=%d", owner.namespace, owner.name,
             len(changes))


def _text(r: LabelRun) -> str:
    lines = [f"{k}={v}" for k, v in sorted(r.labels.items())]
    lines.append(f"# feature file {'updated' if r.file_changed else 'unchanged'}; "
                 f"{len(r.node_changes)} node label change(s)"
                 + ("" if r.node_taints is None else f"; taints now {len(r.node_taints)}"))
    lines += [f"# warning: {w}" for w in r.warnings]
    return "\n".join(lines)


class _NoKube(Exception):
    """Stands in for KubeError when the Node is not patched (the kubernetes client stays unloaded)."""


def _kube_error(patch_node: bool) -> type[Exception]:
    if not patch_node:
        return _NoKube
    from node_agent.kube import KubeError

    return KubeError


def run(args: argparse.Namespace) -> int:
    kube_error = _kube_error(args.patch_node)
    if args.replicas < 1:
        raise UsageError(f"--replicas must be at least 1 (got {args.replicas})")
    if (args.node_label or args.node_taint) and not args.patch_node:
        flag = "--node-label" if args.node_label else "--node-taint"
        raise UsageError(f"{flag} needs --patch-node (the labels and taints go onto the Node)")
    try:
        want = Requested.from_flags(args.node_label, args.node_taint)
    except NodeConfigError as e:
        raise UsageError(str(e)) from e
    if args.daemonset is not None and not args.patch_node:
        raise UsageError("--daemonset needs --patch-node (it gates and withdraws the Node's labels)")
    ctx = AgentContext.from_args(args)
    if not args.loop:
        try:
            result = label_once(ctx, args, want)
        except NvmlError as e:
            ctx.emit({"error": f"NVML: {e}"}, f"error: NVML: {e}")
            return exitcodes.FAILED
        except HostError as e:
            ctx.emit({"error": str(e)}, f"error: {e}")
            return exitcodes.HOST_INPUT
        except kube_error as e:
            ctx.emit({"error": str(e)}, f"error: {e}")
            return exitcodes.KUBE
        ctx.emit(result.to_dict(), _text(result))
        return exitcodes.OK
    stop = threading.Event()
    previous = _on_signals(stop)
    try:
        done = 0
        while not stop.is_set():
            try:
                result = label_once(ctx, args, want)
                log.info("labelled labels=%d file_changed=%s node_changes=%d taints_changed=%s", len(result.labels),
                         result.file_changed, len(result.node_changes), result.node_taints is not None)
            except (NvmlError, HostError, kube_error) as e:
                log.warning("labelling failed error=%r", str(e))
            done += 1
            if args.iterations and done >= args.iterations:
                break
            stop.wait(args.interval)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.is_set() and args.daemonset is not None:
        _withdraw_if_retired(ctx, args.daemonset, args.output_file)
    return exitcodes.OK


def _on_signals(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("labels", help="GPU feature-discovery labels: NFD feature file and Node labels",
                              description=(__doc__ or "").splitlines()[0])
    p.add_argument("--mig-strategy", choices=("none", "single", "mixed"), default="none")
    p.add_argument("--replicas", type=int, default=1, help="time-slicing/MPS replicas per GPU (1 = not shared)")
    p.add_argument("--sharing-strategy", choices=("time-slicing", "mps"), default="time-slicing")
    p.add_argument("--output-file", default=FEATURE_FILE, metavar="HOST_PATH")
    p.add_argument("--no-output-file", action="store_true", help="do not write the NFD feature file")
    p.add_argument("--no-timestamp", action="store_true", help="omit nvidia.com/gfd.timestamp")
    p.add_argument("--patch-node", action="store_true", help="also set the labels on the Node")
    p.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE",
                   help="with --patch-node: a node-group label to keep on the Node (repeatable)")
    p.add_argument("--node-taint", action="append", default=[], metavar="KEY=VALUE:EFFECT",
                   help="with --patch-node: a node-group taint to keep on the Node (repeatable; KEY:EFFECT "
                        "for an empty value)")
    p.add_argument("--loop", action="store_true", help="re-label every --interval seconds until SIGTERM")
    p.add_argument("--interval", type=float, default=60.0)
    p.add_argument("--iterations", type=int, default=0, help="with --loop: stop after N runs (0 = never)")
    p.add_argument("--daemonset", type=Owner.parse, metavar="NAMESPACE/NAME",
                   help="with --patch-node: the DaemonSet this runs under; label only while the Node carries "
                        "gpu-setup-complete, and on SIGTERM withdraw the labels if that DaemonSet is gone or "
                        "being deleted")
    p.set_defaults(run=run)
