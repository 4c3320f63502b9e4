"""``labels``: GPU feature-discovery labels, as an NFD local feature file and (``--patch-node``) on the Node.

One run (or, with ``--loop``, one run every ``--interval`` seconds until SIGTERM): read the GPUs
through NVML, compute the labels (``node_agent.labeller.gfd``), replace the feature file
(``/etc/kubernetes/node-feature-discovery/features.d/gfd``, atomically, only when it changed) and,
when asked, merge-patch the Node: set what changed and delete ``nvidia.com/*`` labels we own that
no longer apply. A node without an NVIDIA GPU gets only the timestamp and ``vgpu.present=false``.

Sharing (``.replicas``, ``.sharing-strategy``, ``-SHARED``, ``mps.capable``) and the MIG strategy come
from the device plugin's own config, as NVIDIA's GFD reads it: ``--config-file``, or ``--config-dir``
with the named config the node label ``--config-label`` picks (else ``--default-config``), the device
plugin's flags and selection code (``node_agent.deviceplugin.nodelabel``). Every run reads the label
(one GET of the own Node) and the file again, so the labels follow a config the plugin switched to
within one ``--interval``; a label naming no config, or a config that does not parse, keeps the last
good one, as the plugin does. Without a config, ``--replicas``/``--sharing-strategy`` describe the
sharing. ``--mig-strategy`` beats the config's ``flags.migStrategy``.

``nvidia.com/gpu.clique`` comes from NVML's fabric info, ``nvidia.com/vgpu.*`` from the PCI config
space (``node_agent.host.vgpu``); a config space this process cannot read whole (it needs
CAP_SYS_ADMIN, which NVIDIA's GFD gets by running privileged) leaves the ``vgpu.*`` labels out with a
warning, as NVIDIA's GFD does.

With ``--patch-node`` the same patch also carries the node group's own labels and taints
(``--node-label KEY=VALUE``, ``--node-taint KEY=VALUE:EFFECT``; rules in ``node_agent.labeller.nodeconfig``),
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

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from node_agent.deviceplugin import config
from node_agent.deviceplugin.named import NamedConfigError
from node_agent.deviceplugin.nodelabel import ConfigSelector, ConfigSource
from node_agent.host import HostError, HostRoot, VgpuDevice, VgpuScanError, nvidia_gpus, vgpu_devices
from node_agent.kube import KubeError
from node_agent.kube.nodeowner import decide_and_patch
from node_agent.kube.ownnode import OwnNodeWatch
from node_agent.kube.watch import WatchTiming
from node_agent.labeller import gfd, inventory
from node_agent.labeller.inventory import InventoryContext, Listing
from node_agent.labeller.nodeconfig import NodePlan, NodeSnapshot, Requested, plan
from node_agent.labeller.nodepatch import KubeNodeApi, NodeApi, NodeEnv, WatchedNodeApi, apply_plan, snapshot
from node_agent.nvml import FabricInfo, GpuInstanceProfile, GpuRecovery, Inventory, NvmlError, NvmlSession
from node_agent.nvml.xidwatch import XidRecorder, XidSeen
from nvgpu import labels as label_names
from nvgpu.driver import loaded_modules
from nvgpu.nodescripts import facts

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
        """The flag's value; a malformed one raises ``ValueError`` naming it (the command line's usage error)."""
        namespace, slash, name = text.partition("/")
        if not slash or not namespace or not name or "/" in name:
            raise ValueError(f"expected NAMESPACE/NAME, got {text!r}")
        return cls(namespace, name)


@dataclass(frozen=True)
class LabelOptions:
    """How one labelling run works (the ``labels`` flags, parsed)."""

    #: ``--mig-strategy``, ``--replicas``, ``--sharing-strategy``: the sharing without a device-plugin config.
    mig_strategy: gfd.MigStrategy | None = None
    replicas: int | None = None
    sharing_strategy: gfd.SharingStrategy | None = None
    timestamp: bool = True
    #: The NFD feature file (a host path); written unless ``write_file`` is off.
    output_file: str = FEATURE_FILE
    write_file: bool = True
    patch_node: bool = False
    #: The DaemonSet this runs under: gates the patches, and its retirement withdraws the labels.
    daemonset: Owner | None = None
    #: Keep this node's GPU inventory objects (``node_agent.labeller.inventory``) current, as this says.
    inventory: InventoryContext | None = None


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


class NodeConfigLabel:
    """The node label naming this node's device-plugin config, read with one GET of the own Node per run.

    A :class:`~node_agent.deviceplugin.nodelabel.LabelSource`. The device plugin keeps a watch on its
    Node for this; the labeller relabels once per interval anyway, and its role may only get and patch its
    own Node (no list, no watch), so reading the label when it labels is both enough and all it may do.
    """

    def __init__(self, ctx: NodeEnv, key: str) -> None:
        self.ctx = ctx
        self.key = key

    def label(self) -> str | None:
        """The label now. A fresh client per read, as :func:`patch_node` has: a kept-alive connection to an
        API server that hangs would wait out the whole read timeout instead of failing at connect."""
        try:
            return self.ctx.node_api().labels(self.ctx.require_node_name()).get(self.key)
        except KubeError as e:  # the selector keeps the last label it read
            raise OSError(f"cannot read node label {self.key}: {e}") from e


@dataclass(frozen=True)
class Sharing:
    """What the labels say about sharing: the MIG strategy and the replicated resources."""

    mig_strategy: gfd.MigStrategy = "none"
    strategy: gfd.SharingStrategy = "time-slicing"
    shared: tuple[gfd.SharedResource, ...] = ()

    @classmethod
    def from_settings(cls, s: config.Settings) -> Sharing:
        """The device plugin's resolved config, as NVIDIA's resource labeller reads ``sharing``: every
        replicated resource with its replicas, renamed when ``renameByDefault`` advertises ``.shared``."""
        return cls(
            mig_strategy=s.mig_strategy.value,
            strategy="mps" if s.sharing.strategy is config.SharingStrategy.MPS else "time-slicing",
            shared=tuple(gfd.SharedResource(r.name, r.replicas, r.advertised_as != r.name)
                         for r in s.sharing.resources),
        )

    @classmethod
    def from_flags(cls, options: LabelOptions) -> Sharing:
        """``--mig-strategy``, ``--replicas``, ``--sharing-strategy``: full GPUs shared ``--replicas`` ways."""
        replicas = options.replicas or 1
        return cls(mig_strategy=options.mig_strategy or "none", strategy=options.sharing_strategy or "time-slicing",
                   shared=(gfd.SharedResource(gfd.GPU, replicas),) if replicas > 1 else ())


class SharingSource:
    """The device plugin's config, re-read on every run: the selection (node label, files) and its content.

    Like the plugin (``ConfigSelector`` and ``config.load``, the same code; without the checks only the
    plugin makes at start, as NVIDIA's GFD reads the file), a config that cannot be selected or parsed
    keeps the last good one, so the labels keep describing what the plugin still serves; with none yet
    the run fails (the plugin would not start either). ``cli`` carries ``--mig-strategy``, which beats
    the file as the plugin's own flag does.
    """

    def __init__(self, selector: ConfigSelector, cli: config.Overrides | None = None) -> None:
        self.selector = selector
        self.cli = cli or config.Overrides()
        self.current: Sharing | None = None
        self._seen: tuple[str | None, str | None] | None = None

    def read(self) -> tuple[Sharing, str | None]:
        """The sharing to label with, and a warning when the last good config stands in."""
        try:
            sel, text = self.selector.read()
            settings = config.load(text, None, self.cli, source=f"config {sel.name or '(none)'}",
                                   plugin_checks=False)
        except (NamedConfigError, config.ConfigError, OSError) as e:
            if self.current is None:
                raise HostError(f"device-plugin config: {e}") from e
            return self.current, f"device-plugin config unusable, labelling with the last good one: {e}"
        if (sel.name, text) != self._seen:
            log.info("event=config name=%s reason=%s", sel.name, sel.reason)
            self._seen = (sel.name, text)
        self.current = Sharing.from_settings(settings)
        return self.current, None


def sharing_source(ctx: NodeEnv, source: ConfigSource, mig_strategy: str | None) -> SharingSource | None:
    """The config source the flags name (None: no config, the sharing flags decide)."""
    if source.config_file is None and source.config_dir is None:
        return None
    labels = NodeConfigLabel(ctx, source.config_label) if source.config_dir is not None and ctx.node_name else None
    cli = config.Overrides(mig_strategy=mig_strategy) if mig_strategy else None
    return SharingSource(source.selector(labels), cli)


def collect(ctx: NodeEnv, options: LabelOptions, source: SharingSource | None = None
            ) -> tuple[dict[str, str], tuple[str, ...]]:
    host = ctx.host
    warnings: list[str] = []
    sharing = Sharing.from_flags(options)
    if source is not None:
        sharing, stale = source.read()
        warnings += [stale] if stale else []
    vgpu: tuple[VgpuDevice, ...] | None
    try:
        vgpu = vgpu_devices(host)
    except VgpuScanError as e:  # cannot tell: NVIDIA's GFD leaves the vgpu labels out then
        vgpu = None
        warnings.append(f"no vGPU labels: {e}")
    on_bus = nvidia_gpus(host)
    classes = {d.pci_class[:6] for d in on_bus}
    mode = "compute" if classes == {"0x0302"} else "graphics" if classes == {"0x0300"} else "unknown"
    settings = gfd.LabelSettings(
        mig_strategy=sharing.mig_strategy, sharing_strategy=sharing.strategy, shared=sharing.shared,
        machine=(host.read_text_or_none(DMI_PRODUCT) or "").strip() or None, gpu_mode=mode,
        timestamp=int(time.time()) if options.timestamp else None, vgpu=vgpu,
    )
    if not on_bus:
        return gfd.compute_labels([], None, {}, settings), tuple(warnings)
    with ctx.nvml() as nvml:
        inv = nvml.inventory()
        driver = nvml.driver()
        profiles: dict[int, tuple[GpuInstanceProfile, ...]] = {
            g.index: nvml.gpu_instance_profiles(g.index) for g in inv.gpus if g.mig_enabled}
        fabric: dict[int, FabricInfo | None] = {g.index: nvml.fabric_info(g.index) for g in inv.gpus}
    clique, disagreement = gfd.fabric_clique(fabric)
    warnings += [f"GPU {lost.index} left out: {lost.reason}" for lost in inv.lost]
    warnings += [f"GPU {g.index} labelled without its {what}" for g in inv.gpus for what in g.unreadable]
    warnings += [disagreement] if disagreement else []
    settings = dataclasses.replace(settings, clique=clique)
    return gfd.compute_labels(inv.gpus, driver, profiles, settings), tuple(warnings)


def label_once(ctx: NodeEnv, options: LabelOptions, want: Requested,
               source: SharingSource | None = None, xids: Mapping[int, XidSeen] | None = None, *,
               listing: Listing | None = None) -> LabelRun:
    """One labelling run; ``xids``: the loop's recorder's last XID per GPU, for the inventory; ``listing``:
    the loop's :class:`~node_agent.labeller.inventory.Listing` of the GPU objects."""
    failure: NvmlError | HostError | None = None
    try:
        labels, warnings = collect(ctx, options, source)
    except (NvmlError, HostError) as e:
        if not options.patch_node:
            raise
        # The group's labels and taints do not depend on the GPUs: apply them anyway, then report.
        labels, warnings, failure = {}, (), e
    changed = False
    if failure is None and options.write_file:
        changed = write_feature_file(ctx.host, options.output_file, labels)
    changes: dict[str, str | None] = {}
    taints: tuple[dict[str, Any], ...] | None = None
    if options.patch_node:
        changes, taints = patch_node(ctx, want, None if failure else labels, gated=options.daemonset is not None)
    if failure is not None:
        log.warning("node labels applied without GPU labels changes=%d error=%r", len(changes), str(failure))
        raise failure
    if options.inventory is not None:
        try:
            sync_inventory(ctx, options, options.inventory, source, xids, listing=listing)
        except (NvmlError, kube_error(True)) as e:  # the labels landed; the objects follow next run
            log.warning("event=gpu-inventory-failed error=%s", e)
            warnings = (*warnings, f"GPU inventory not updated: {e}")
    return LabelRun(labels, changed, changes, warnings, taints)


def write_feature_file(host: HostRoot, path: str, labels: Mapping[str, str]) -> bool:
    """Replace the NFD feature file when a label in it changed; a new timestamp alone leaves it (NFD
    would otherwise rewrite the Node for it every interval). Answers whether the file was written."""
    try:
        text = host.read_text_or_none(path)
    except HostError:
        text = None
    if text is not None and gfd.same_but_timestamp(gfd.parse_feature_file(text), labels):
        return False
    return host.write_atomic(path, gfd.feature_file(labels))


def remove_inventory(ctx: NodeEnv, inv_ctx: InventoryContext) -> inventory.SyncResult:
    """Delete this node's GPU objects (a sync against no GPUs)."""
    api = ctx.node_api()
    if not isinstance(api, KubeNodeApi):
        raise TypeError("the GPU inventory needs the API server client")
    return inventory.sync(api.kube, ctx.require_node_name(), Inventory(()), None, inv_ctx, node_uid=lambda: "")


def sync_inventory(ctx: NodeEnv, options: LabelOptions, inv_ctx: InventoryContext,
                   source: SharingSource | None = None, xids: Mapping[int, XidSeen] | None = None, *,
                   listing: Listing | None = None) -> inventory.SyncResult:
    """This node's GPU objects made to match the GPUs NVML lists (``node_agent.labeller.inventory``)."""
    api = ctx.node_api()
    if not isinstance(api, KubeNodeApi):
        raise TypeError("the GPU inventory needs the API server client")
    sharing = source.read()[0] if source is not None else Sharing.from_flags(options)
    replicas = next((r.replicas for r in sharing.shared if r.name == "nvidia.com/gpu"), 1)
    with ctx.nvml() as nvml:
        inv = nvml.inventory()
        driver = nvml.driver() if inv.gpus else None
        recoveries = _recoveries(nvml, inv)
    node = ctx.require_node_name()
    node_obj = api.read_node(node)  # one read: its uid for new objects, the driver upgrade's state
    meta = node_obj.get("metadata") or {}
    node_labels = meta.get("labels") or {}
    node_driver = inventory.NodeDriver(
        kernel_modules=_kernel_modules(ctx.host) if inv.gpus else None,
        upgrade_state=node_labels.get(label_names.DRIVER_UPGRADE_STATE),
        upgrade_failure=(meta.get("annotations") or {}).get(label_names.DRIVER_UPGRADE_FAILURE),
        check_verdict=node_labels.get(label_names.NODE_CHECK),
        check_reasons=tuple(r for r in node_labels.get(label_names.NODE_CHECK_REASONS, "").split(".") if r))
    try:
        return inventory.sync(api.kube, node, inv, driver,
                              dataclasses.replace(inv_ctx, mig_strategy=sharing.mig_strategy, replicas=replicas),
                              node_uid=lambda: str(meta["uid"]), xids=xids, node_driver=node_driver,
                              recoveries=recoveries, listing=listing)
    except Exception:
        if listing is not None:  # a write may have landed: list again next run
            listing.drop()
        raise


def _recoveries(nvml: NvmlSession, inv: Inventory) -> dict[int, GpuRecovery]:
    """What NVML says each GPU still needs after an error; a GPU that fails the reads is left out (logged):
    its object then says what the XIDs say, as before."""
    out: dict[int, GpuRecovery] = {}
    for g in inv.gpus:
        try:
            out[g.index] = nvml.recovery(g.index)
        except NvmlError as e:
            log.warning("event=recovery-read-failed gpu=%d error=%s", g.index, e)
    return out


def _kernel_modules(host: HostRoot) -> str | None:
    """``open`` or ``proprietary``, as ``/proc/driver/nvidia/version`` says; None when it is unreadable."""
    try:
        text = host.read_text_or_none(facts.DRIVER_VERSION_FILE)
    except HostError:
        return None
    return loaded_modules(text).value if text else None


def patch_node(ctx: NodeEnv, want: Requested, gpu_labels: dict[str, str] | None, *, gated: bool = False
               ) -> tuple[dict[str, str | None], tuple[dict[str, Any], ...] | None]:
    """One merge patch of the Node: GFD label changes (unless ``gpu_labels`` is None) plus the node config.

    Retried from a fresh read when the Node changed underneath (409 on the resourceVersion, sent with a
    new taint list and, when ``gated``, always). ``gated``: write nothing unless the Node carries
    ``gpu-setup-complete``.
    """
    node = ctx.require_node_name()
    api = ctx.node_api()

    def decide(snap: NodeSnapshot) -> tuple[NodePlan, str] | None:
        if gated and label_names.GPU_SETUP_COMPLETE not in snap.labels:
            log.info("node setup is not complete (or was undone): not labelling node=%s", node)
            return None
        config = plan(snap, want)
        label_patch = gfd.label_changes(snap.labels, gpu_labels) if gpu_labels is not None else {}
        label_patch |= config.labels
        full = NodePlan(label_patch, config.annotations, config.taints, config.taints_read)
        if full.empty:
            return None
        return full, snap.resource_version if gated or full.taints is not None else ""

    # ``snapshot`` and ``apply_plan`` looked up at each call: tests put stand-ins in their place.
    done = decide_and_patch(lambda: snapshot(api, node), decide, lambda d: apply_plan(api, node, *d),
                            attempts=CONFLICT_ATTEMPTS, node=node)
    if done is None:
        return {}, None
    return dict(done[0].labels), done[0].taints


def withdraw(ctx: NodeEnv, feature_file: str = FEATURE_FILE) -> dict[str, str | None]:
    """Take off everything the labeller put on: the GFD labels, the node-group labels and taints it owns
    (and their ownership annotations), and the feature file. Foreign labels and taints stay."""
    changes, _ = patch_node(ctx, Requested(), {})
    ctx.host.remove(feature_file)
    return changes


def withdraw_if_retired(ctx: NodeEnv, owner: Owner, feature_file: str,
                        inventory: InventoryContext | None = None) -> None:
    """On the way out (SIGTERM): withdraw the labels when ``owner`` is gone or being deleted, else leave them.
    With ``inventory``, the node's GPU objects go too: a node group removed from the stack leaves no GPUs
    listed for nodes nobody keeps them current on (the stack's destroy removes the kind, and them, anyway)."""
    try:
        if not ctx.node_api().daemonset_retired(owner.namespace, owner.name):
            return
        changes = withdraw(ctx, feature_file)
        if inventory is not None:
            remove_inventory(ctx, inventory)
    except (HostError, KubeError) as e:  # the pod is stopping: report and exit
        log.warning("could not withdraw the labels daemonset=%s/%s error=%r", owner.namespace, owner.name, str(e))
        return
    log.info("daemonset retired, labels withdrawn daemonset=%s/%s node_changes=%d", owner.namespace, owner.name,
             len(changes))


class WatchedNode:
    """A :class:`~node_agent.labeller.nodepatch.NodeEnv` whose Node reads come from a watch of the own Node
    (:class:`~node_agent.kube.ownnode.OwnNodeWatch`): the loop's labelling runs, the config label and the
    inventory read the Node from memory, and a run that changes nothing makes no request."""

    def __init__(self, ctx: NodeEnv, watch: OwnNodeWatch) -> None:
        self.ctx = ctx
        self.watch = watch

    @property
    def host(self) -> HostRoot:
        return self.ctx.host

    @property
    def node_name(self) -> str | None:
        return self.ctx.node_name

    def nvml(self) -> AbstractContextManager[NvmlSession]:
        return self.ctx.nvml()

    def require_node_name(self) -> str:
        return self.ctx.require_node_name()

    def node_api(self) -> NodeApi:
        api = self.ctx.node_api()
        return WatchedNodeApi(api.kube, self.watch) if isinstance(api, KubeNodeApi) else api


@contextlib.contextmanager
def watching_node(ctx: NodeEnv, interval: float) -> Iterator[NodeEnv]:
    """``ctx`` with its own Node watched for as long as the loop runs (a context without the API server
    client, as in tests with a fake Node, is given back as it is). Where the watch is refused the Node is
    read once per ``interval``, as before."""
    api = ctx.node_api()
    if not isinstance(api, KubeNodeApi):
        yield ctx
        return
    watch = OwnNodeWatch(api.kube, ctx.require_node_name(), timing=WatchTiming(relist_interval_s=interval))
    watch.start()
    try:
        yield WatchedNode(ctx, watch)
    finally:
        watch.stop()


class _NoKube(Exception):
    """Stands in for KubeError when the Node is not patched (a run that makes no API request catches none)."""


def kube_error(patch_node: bool) -> type[Exception]:
    """The Kubernetes error a run can raise: ``KubeError`` when the Node is patched."""
    return KubeError if patch_node else _NoKube


def label_loop(ctx: NodeEnv, options: LabelOptions, want: Requested, source: SharingSource | None,
               stop: threading.Event, *, interval: float, iterations: int = 0) -> None:
    """Label every ``interval`` seconds until ``stop`` is set (or after ``iterations`` runs, when not 0).

    A failed run is logged and retried next interval: a GPU or API server that is back is relabelled
    without a restart. Warnings are logged when they change, not every interval. With the inventory kept,
    an XID recorder (``node_agent.nvml.xidwatch``) watches NVML's events meanwhile, and an XID starts the
    next run at once.
    """
    errors = (NvmlError, HostError, kube_error(options.patch_node))
    done = 0
    reported: tuple[str, ...] = ()
    xid_raised = threading.Event()
    recorder = None
    listing = None
    if options.inventory is not None:
        listing = Listing()
        recorder = XidRecorder(ctx.nvml, xid_raised.set)
        recorder.start()
    try:
        while not stop.is_set():
            xid_raised.clear()
            try:
                result = label_once(ctx, options, want, source, recorder.seen() if recorder else None,
                                    listing=listing)
                log.info("labelled labels=%d file_changed=%s node_changes=%d taints_changed=%s changed=%s",
                         len(result.labels), result.file_changed, len(result.node_changes),
                         result.node_taints is not None, ",".join(sorted(result.node_changes)) or "-")
                if result.warnings != reported:  # once, not every interval
                    for w in result.warnings:
                        log.warning("labelling warning=%r", w)
                    reported = result.warnings
            except errors as e:
                log.warning("labelling failed error=%r", str(e))
            done += 1
            if iterations and done >= iterations:
                break
            _wait(stop, xid_raised, interval)
    finally:
        if recorder is not None:
            recorder.stop()


def _wait(stop: threading.Event, early: threading.Event, seconds: float) -> None:
    """Wait ``seconds``, less when ``early`` or ``stop`` is set (each checked at least twice a second)."""
    deadline = time.monotonic() + seconds
    while not stop.is_set() and not early.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        early.wait(min(left, 0.5))
