"""``runtime apply|rollback``: containerd or CRI-O with the nvidia runtime and CDI, as a drop-in.

Which runtime: containerd when ``/etc/containerd/config.toml`` exists; CRI-O when any of
``/etc/crio/crio.conf``, ``/etc/crio/crio.conf.d``, a ``crio`` binary or its socket is there. Both
or neither is refused (exit 3) with the paths looked at; nothing is written.

containerd layouts, chosen from ``/etc/containerd/config.toml``'s ``version``: 2 (containerd 1.x, CRI plugin
``io.containerd.grpc.v1.cri``) and 3 (containerd 2.x, ``io.containerd.cri.v1.runtime``).

* Deckhouse nodes (``/etc/containerd/deckhouse.toml`` present): the drop-in goes to ``conf.d``
  (1.x) or ``conf2.d`` (2.x) and bashible merges it; the file is byte-identical to what
  ``gpu-runtime.sh`` writes.
* Elsewhere: the drop-in goes to ``/etc/containerd/conf.d`` and ``config.toml`` gets an ``imports``
  entry for it if it has none. containerd 1.x replaces a whole plugin section from an import (its
  ``mergeConfig``: "Replace entire sections instead of merging map's values"; containerd#5837), so on
  1.x the drop-in carries a copy of the CRI section plus our keys, as NVIDIA's toolkit installer does (a
  drop-in of our keys alone would put every other CRI setting back to containerd's defaults); 2.x merges
  plugin sections (containerd#9982), so there it carries only our keys.
* containerd 1.x, later edits: the copy is what containerd runs with, so an edit of config.toml's CRI
  section (a ``sandbox_image``, a mirror) is not in effect until the copy is refreshed. ``runtime apply``
  (node setup runs it at each start of its pod) copies the section again, says which keys it took and
  restarts containerd; in between, ``check`` (the runtime line) names the keys that are not in effect
  (:func:`copy_drift`). Edits belong in ``config.toml``: the drop-in is rewritten from it.

* CRI-O: ``/etc/crio/crio.conf.d/99-nvidia.conf`` registers the ``nvidia`` handler
  (``runtime_path = "/usr/bin/nvidia-container-runtime"``, ``runtime_type = "oci"``, conmon's
  ``monitor_path`` when one is installed), makes it the default and names the CDI spec dirs. It is
  written only when the nvidia runtime binary exists (CRI-O does not start with a handler whose
  ``runtime_path`` is missing). CRI-O is restarted, not reloaded: SIGHUP (``systemctl reload
  crio``) re-reads only a few options, not the runtimes table or ``default_runtime``; running
  containers survive the restart (conmon holds them). A note is given when none of the low-level
  ``runtimes`` the toolkit's config names is installed.

* The NVIDIA toolkit's ``/etc/nvidia-container-runtime/config.toml`` (both runtimes, only where the
  nvidia runtime is installed): our block on top sets
  ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` (unless the node group chose the
  device plugin's ``envvar`` strategy) and ``accept-nvidia-visible-devices-as-volume-mounts = true``, so an
  unprivileged pod that sets ``NVIDIA_VISIBLE_DEVICES=all`` gets no GPU: it gets the ones its device
  list names. The toolkit's package owns the file, so it is edited in place, not journaled: rollback
  removes the block and re-enables the lines it disabled, and a package upgrade in between is not undone.
  The toolkit reads it for each new container: no restart.

Apply is idempotent (nothing is written when the files are already right) and atomic per file, and
records what it changes in the rollback journal first. Rollback undoes exactly that and keeps every later
edit of someone else's as it is now (teardown runs it at each deletion of a setup pod):

* our drop-ins (containerd's, CRI-O's) are ours, and go. One that someone edited since we wrote it goes
  too (it names the nvidia runtime, which teardown may take away), but the edited file is kept under the
  agent's state dir and a note says where; apply, rewriting such a file, names the keys it puts back.
* ``config.toml`` is not ours: the journal records the ``imports`` entry apply added, not the file, and
  rollback takes out that entry only (the line as it was when it is still as we wrote it; else our item
  out of the list), so a later ``sandbox_image`` or mirror stays. An entry someone else took out already,
  or one that a drop-in of theirs is imported through, is left, with a note. Journals of earlier
  versions (a copy of the whole file) are read the same way: the copy says only whether there was a line.

A malformed config is reported and nothing is touched, at apply and at rollback.

Which drop-in, with which content, and when the step is refused is ``nvgpu.nodescripts.plan.RUNTIME_DROPIN``
(``gpu-runtime.sh`` is rendered from it): this module detects the facts it chooses from (:func:`_facts`) and
does what only the agent does (the layout outside Deckhouse, edit notes, restarts). The toolkit config's edit is
``plan.toolkit_config``, applied with ``node_agent.setup.executor.block_edited``.
"""

from __future__ import annotations

import copy
import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, Literal

from node_agent.host import CommandNotFound, HostError, HostRoot, nvidia_gpus
from node_agent.host.root import CommandTimeout
from node_agent.setup.executor import Chosen, block_edited, block_restored, choose, read_ours
from node_agent.setup.journal import AddedItem, Journal, Recorded
from node_agent.setup.tomlwrite import dotted, dumps, flatten
from nvgpu import toolkit as toolkitspec
from nvgpu.nodescripts import facts, plan
from nvgpu.nodescripts.content import (
    HEADER,
    dropin_for,
)

RESTART_TIMEOUT_S = 120
VERSION_TIMEOUT_S = 10
TOOLKIT_CONFIG = facts.TOOLKIT_CONFIG

Runtime = Literal["containerd", "crio"]


class RuntimeDetectionError(HostError):
    """Neither or both of containerd and CRI-O were found: the agent will not guess."""


class CrioConfigError(HostError):
    """A CRI-O config file is not valid TOML."""


class ToolkitConfigError(HostError):
    """The NVIDIA toolkit's config is not valid TOML, or our block cannot be added without changing it."""


def _crio_markers(host: HostRoot) -> list[str]:
    """The CRI-O paths present on the host: config, drop-in dir, binary, socket."""
    files = [facts.CRIO_CONFIG] if host.path(facts.CRIO_CONFIG).is_file() else []
    files += [facts.CRIO_DROPIN_DIR] if host.is_dir(facts.CRIO_DROPIN_DIR) else []
    files += [p for p in facts.CRIO_BINARIES if host.path(p).is_file()]
    return files + [p for p in facts.CRIO_SOCKETS if host.exists(p)]


def _runtime_fact(host: HostRoot) -> dict[str, str]:
    """The facts ``runtime`` and ``crio_markers`` of ``plan.RUNTIME_DROPIN``."""
    containerd = host.exists(facts.CONTAINERD_CONFIG)
    crio = _crio_markers(host)
    runtime = ("both" if crio else "containerd") if containerd else ("crio" if crio else "none")
    return {"runtime": runtime, "crio_markers": ", ".join(crio)}


def detect_runtime(host: HostRoot) -> Runtime:
    """The node's container runtime; refuses (``RuntimeDetectionError``, the plan's message) when both or
    neither are there."""
    detected = _runtime_fact(host)
    if detected["runtime"] in ("both", "none"):
        raise RuntimeDetectionError(choose(plan.RUNTIME_DROPIN, detected).refuse, facts.CONTAINERD_CONFIG)
    return "crio" if detected["runtime"] == "crio" else "containerd"


class ContainerdConfigError(HostError):
    """containerd's config is missing, malformed or of an unsupported version."""


@dataclass(frozen=True)
class ContainerdConfig:
    version: int
    doc: dict[str, Any]
    text: str
    deckhouse: bool

    @property
    def cri_plugin(self) -> str:
        return facts.CRI_PLUGIN[self.version]

    @property
    def dropin_dir(self) -> str:
        return facts.DECKHOUSE_DROPIN_DIRS[self.version] if self.deckhouse else facts.CONTAINERD_IMPORT_DIR

    @property
    def dropin_path(self) -> str:
        return f"{self.dropin_dir}/{facts.RUNTIME_DROPIN_NAME}"


def load_config(host: HostRoot) -> ContainerdConfig:
    text = host.read_text_or_none(facts.CONTAINERD_CONFIG)
    if text is None:
        raise ContainerdConfigError(f"{facts.CONTAINERD_CONFIG} is missing: is containerd installed?",
                                    facts.CONTAINERD_CONFIG)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ContainerdConfigError(f"{facts.CONTAINERD_CONFIG} is not valid TOML: {e}", facts.CONTAINERD_CONFIG) from e
    version = doc.get("version", 1)
    shown = str(version) if type(version) is int else repr(version)
    chosen = choose(plan.RUNTIME_DROPIN, {"runtime": "containerd", "deckhouse": "false", "containerd_version": shown})
    if not chosen.agent_layout:  # the plan's layouts are for versions 2 and 3 only
        raise ContainerdConfigError(chosen.refuse, facts.CONTAINERD_CONFIG)
    return ContainerdConfig(int(version), doc, text, host.exists(facts.DECKHOUSE_CONTAINERD_BASE))


def _dig(doc: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(k)
    return doc


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _dropin_files(host: HostRoot, cfg: ContainerdConfig) -> list[str]:
    if cfg.deckhouse:
        d = cfg.dropin_dir
        return [f"{d}/{n}" for n in host.listdir(d) if n.endswith(".toml")]
    out: list[str] = []
    for pattern in cfg.doc.get("imports", []) or []:
        if not isinstance(pattern, str) or not pattern.startswith("/"):
            continue
        parent = pattern.rsplit("/", 1)[0] or "/"
        out += [f"{parent}/{n}" for n in host.listdir(parent) if fnmatch.fnmatch(f"{parent}/{n}", pattern)]
    return sorted(set(out))


def effective_config(host: HostRoot, cfg: ContainerdConfig) -> dict[str, Any]:
    """config.toml with its drop-ins merged in (what containerd will run with)."""
    doc = cfg.doc
    for path in _dropin_files(host, cfg):
        try:
            doc = _merge(doc, tomllib.loads(host.read_text(path)))
        except tomllib.TOMLDecodeError as e:
            raise ContainerdConfigError(f"{path} is not valid TOML: {e}", path) from e
    return doc


@dataclass(frozen=True)
class RuntimeStatus:
    ready: bool
    detail: str
    version: int | None = None
    runtime: Runtime | None = None


def crio_files(host: HostRoot) -> list[str]:
    """crio.conf, then the drop-ins in lexical order (CRI-O's own order; hidden files skipped)."""
    files = [facts.CRIO_CONFIG] if host.path(facts.CRIO_CONFIG).is_file() else []
    d = facts.CRIO_DROPIN_DIR
    return files + [f"{d}/{n}" for n in host.listdir(d) if not n.startswith(".") and host.path(f"{d}/{n}").is_file()]


def crio_effective_config(host: HostRoot) -> dict[str, Any]:
    """CRI-O's config as it will run: crio.conf with every drop-in merged over it."""
    doc: dict[str, Any] = {}
    for path in crio_files(host):
        try:
            doc = _merge(doc, tomllib.loads(host.read_text(path)))
        except tomllib.TOMLDecodeError as e:
            raise CrioConfigError(f"{path} is not valid TOML: {e}", path) from e
    return doc


def crio_version(host: HostRoot) -> str | None:
    """``crio --version``'s version number, None when crio is not there or says nothing usable."""
    try:
        run = host.run(["crio", "--version"], timeout_s=VERSION_TIMEOUT_S)
    except HostError:
        return None
    m = re.search(r"(?i)\bversion\b[:\s]+v?(\d+\.\d+(?:\.\d+)?)", run.stdout + run.stderr) if run.ok else None
    return m.group(1) if m else None


def _crio_status(host: HostRoot) -> RuntimeStatus:
    """Ready when CRI-O has the nvidia handler and its runtime_path exists. CRI-O always has CDI on, so
    CDI alone does not tell a configured node from a bare one (and the device plugin's default
    ``envvar`` strategy needs the nvidia runtime)."""
    version = crio_version(host)
    name = f"crio {version}" if version else "crio"
    try:
        eff = crio_effective_config(host)
    except CrioConfigError as e:
        return RuntimeStatus(False, f"{name}: {e}", runtime="crio")
    path = _dig(eff, "crio", "runtime", "runtimes", facts.NVIDIA_RUNTIME_NAME, "runtime_path")
    if isinstance(path, str) and path.startswith("/") and host.which(path):
        return RuntimeStatus(True, f"{name}: nvidia runtime configured ({path})", runtime="crio")
    return RuntimeStatus(False, f"{name}: CRI-O has no nvidia runtime (crio.runtime.runtimes."
                                f"{facts.NVIDIA_RUNTIME_NAME} with an existing runtime_path)", runtime="crio")


def runtime_status(host: HostRoot) -> RuntimeStatus:
    """containerd: ready with the nvidia runtime (whose binary exists) or CDI enabled; CRI-O: ready with
    the nvidia runtime (whose binary exists)."""
    try:
        if detect_runtime(host) == "crio":
            return _crio_status(host)
        cfg = load_config(host)
        eff = effective_config(host, cfg)
    except (ContainerdConfigError, RuntimeDetectionError) as e:
        return RuntimeStatus(False, str(e))
    cri = _dig(eff, "plugins", cfg.cri_plugin) or {}
    stale = _stale_copy_detail(host, cfg)
    binary = _dig(cri, "containerd", "runtimes", facts.NVIDIA_RUNTIME_NAME, "options", "BinaryName")
    if isinstance(binary, str) and binary.startswith("/") and host.which(binary):
        return RuntimeStatus(True, f"nvidia runtime configured ({binary}){stale}", cfg.version, "containerd")
    if cri.get("enable_cdi", cfg.version == 3) is True:
        return RuntimeStatus(True, f"CDI enabled{stale}", cfg.version, "containerd")
    return RuntimeStatus(False, f"containerd has neither the nvidia runtime nor CDI enabled{stale}", cfg.version,
                         "containerd")


def copies_cri_section(cfg: ContainerdConfig) -> bool:
    """Whether our drop-in carries a copy of config.toml's CRI section: containerd 1.x importing it itself
    (an import replaces the whole section there); not under bashible, which merges key by key."""
    return cfg.version == 2 and not cfg.deckhouse


def _key_list(keys: list[tuple[str, ...]], most: int = 8) -> str:
    names = [dotted(k) for k in sorted(keys)]
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _our_cri_keys(cfg: ContainerdConfig) -> set[tuple[str, ...]]:
    """Our keys in the CRI section, whatever their values: the copy's own, never an operator's edit that lags."""
    ours = tomllib.loads(dropin_for(cfg.version, True, True))["plugins"][cfg.cri_plugin]
    return set(flatten(ours))


def copy_drift(cfg: ContainerdConfig, dropin_text: str) -> list[tuple[str, ...]]:
    """The keys of config.toml's CRI section (ours left out) whose value the drop-in's copy does not have:
    edits made to config.toml since the last apply copied the section, which containerd 1.x does not see
    while the copy is there. Empty where the drop-in carries no copy."""
    if not copies_cri_section(cfg):
        return []
    section = flatten(_dig(cfg.doc, "plugins", cfg.cri_plugin) or {})
    try:
        copy = flatten(_dig(tomllib.loads(dropin_text), "plugins", cfg.cri_plugin) or {})
    except tomllib.TOMLDecodeError:
        return []
    ours = _our_cri_keys(cfg)
    return sorted(k for k in section.keys() | copy.keys() if k not in ours and section.get(k) != copy.get(k))


def _stale_copy_detail(host: HostRoot, cfg: ContainerdConfig) -> str:
    """``; ...`` naming the CRI keys containerd 1.x does not see because our drop-in's copy lags behind
    config.toml, and how to take them; empty when the copy is current (or there is none)."""
    text = host.read_text_or_none(cfg.dropin_path) if copies_cri_section(cfg) else None
    if text is None or not text.startswith(HEADER):
        return ""
    drift = copy_drift(cfg, text)
    if not drift:
        return ""
    return (f"; {cfg.dropin_path} holds the copy of {facts.CONTAINERD_CONFIG}'s [plugins.\"{cfg.cri_plugin}\"] "
            "that containerd 1.x runs with (an import replaces the whole section), taken at the last apply: "
            f"{_key_list(drift)} changed in {facts.CONTAINERD_CONFIG} since and are not in effect; run "
            "'runtime apply' (node setup does at each start of its pod) to take them")


def _facts(host: HostRoot, binary: str, cfg: ContainerdConfig | None = None) -> dict[str, str]:
    """The host facts ``plan.RUNTIME_DROPIN`` chooses from, as the agent detects them (``cfg``: containerd's
    config, on a containerd host)."""
    systemd = cfg is not None and _dig(cfg.doc, "plugins", cfg.cri_plugin, "containerd", "runtimes", "runc",
                                       "options", "SystemdCgroup") is True
    return {**_runtime_fact(host), "containerd_version": str(cfg.version) if cfg else "",
            "deckhouse": "true" if cfg and cfg.deckhouse else "false", "systemd_cgroup": "true" if systemd else "false",
            "nvidia_runtime": "true" if host.is_executable(binary) else "false", "binary": binary,
            "conmon": _conmon(host) or ""}


def _deckhouse_case(host: HostRoot, cfg: ContainerdConfig, binary: str) -> Chosen:
    """The plan's case for this containerd host as Deckhouse lays it out (our keys alone): the drop-in itself
    there; outside Deckhouse, the keys the agent's own layout carries."""
    return choose(plan.RUNTIME_DROPIN, {**_facts(host, binary, cfg), "runtime": "containerd", "deckhouse": "true"})


def render_dropin(host: HostRoot, cfg: ContainerdConfig, binary: str = facts.NVIDIA_CONTAINER_RUNTIME) -> str:
    ours = _deckhouse_case(host, cfg, binary).content
    if ours is None:
        raise ContainerdConfigError(f"no drop-in for containerd config version {cfg.version}", facts.CONTAINERD_CONFIG)
    if cfg.deckhouse or cfg.version == 3:
        return ours
    # containerd 1.x imports replace whole plugin sections: carry the existing CRI section along.
    section = copy.deepcopy(_dig(cfg.doc, "plugins", cfg.cri_plugin) or {})
    merged = _merge(section, tomllib.loads(ours)["plugins"][cfg.cri_plugin])
    return HEADER + "\n" + dumps({"plugins": {cfg.cri_plugin: merged}})


_IMPORTS_RE = re.compile(r"^imports\s*=\s*\[.*?\][ \t]*(#[^\n]*)?$", re.MULTILINE | re.DOTALL)
#: The pattern apply adds to config.toml's ``imports`` (outside Deckhouse).
IMPORT_PATTERN = f"{facts.CONTAINERD_IMPORT_DIR}/*.toml"
PLAIN_DROPIN = f"{facts.CONTAINERD_IMPORT_DIR}/{facts.RUNTIME_DROPIN_NAME}"


def _head_end(text: str) -> int:
    """Where the root table ends: the first table header (top-level keys come before it)."""
    first_table = re.search(r"^\s*\[", text, re.MULTILINE)
    return first_table.start() if first_table else len(text)


def _imports_match(text: str) -> re.Match[str] | None:
    """The top-level ``imports = [...]`` (with a comment after it) in config.toml's text, or None."""
    return _IMPORTS_RE.search(text, 0, _head_end(text))


def _imports_line(patterns: list[str]) -> str:
    return "imports = [" + ", ".join(f'"{p}"' for p in patterns) + "]"


def with_import(cfg: ContainerdConfig, pattern: str) -> str | None:
    """config.toml text that imports ``pattern`` (None when it already does)."""
    imports = cfg.doc.get("imports", []) or []
    if any(isinstance(p, str) and fnmatch.fnmatch(PLAIN_DROPIN, p) for p in imports):
        return None
    line = _imports_line([*imports, pattern])
    head_end = _head_end(cfg.text)
    m = _imports_match(cfg.text)
    if "imports" in cfg.doc:
        if m is None:
            raise ContainerdConfigError(f"{facts.CONTAINERD_CONFIG}: cannot locate the top-level imports line to "
                                        f"add {pattern!r}; add it by hand", facts.CONTAINERD_CONFIG)
        text = cfg.text[: m.start()] + line + cfg.text[m.end():]
    else:
        v = re.search(r"^version\s*=.*$", cfg.text[:head_end], re.MULTILINE)
        at = v.end() + 1 if v else 0
        head = cfg.text[:at] if at <= len(cfg.text) else cfg.text + "\n"  # a version line without its newline
        text = head + line + "\n" + cfg.text[at:]
    try:
        new_doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        new_doc = {}
    if ({k: v for k, v in new_doc.items() if k != "imports"} != {k: v for k, v in cfg.doc.items() if k != "imports"}
            or _imports_match(text) is None):
        raise ContainerdConfigError(f"{facts.CONTAINERD_CONFIG}: adding imports would change other settings; "
                                    "add it by hand", facts.CONTAINERD_CONFIG)
    return text


@dataclass
class RuntimeResult:
    skipped: str | None = None
    containerd_version: int | None = None
    changed: list[str] = field(default_factory=list)
    restarted: bool = False
    notes: list[str] = field(default_factory=list)
    runtime: Runtime | None = None
    restarted_units: list[str] = field(default_factory=list)
    #: What the toolkit config now says about unprivileged containers' NVIDIA_VISIBLE_DEVICES (None: left alone).
    toolkit_accept_envvar: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "runtime": self.runtime, "containerdConfigVersion": self.containerd_version,
                "changed": self.changed, "restarted": self.restarted, "notes": self.notes,
                "toolkitAcceptsEnvvarWhenUnprivileged": self.toolkit_accept_envvar}


def restart_service(host: HostRoot, unit: str, result: RuntimeResult) -> None:
    """``systemctl restart <unit>`` through the host's exec seam; failures become notes."""
    try:
        run = host.run(["systemctl", "restart", unit], timeout_s=RESTART_TIMEOUT_S)
    except CommandNotFound:
        result.notes.append(f"systemctl not found: restart {unit} to apply the change")
        return
    except CommandTimeout as e:
        result.notes.append(str(e))
        return
    if run.ok:
        result.restarted_units.append(unit)
    result.restarted = run.ok
    if not run.ok:
        result.notes.append(f"systemctl restart {unit} failed: {run.stderr.strip()}")


def restart_containerd(host: HostRoot, result: RuntimeResult) -> None:
    restart_service(host, "containerd", result)


def apply_runtime(host: HostRoot, *, restart: bool = True, accept_envvar: bool = False,
                  driver_root: str = "/", toolkit_dir: str | None = None) -> RuntimeResult:
    """Configure the container runtime and the toolkit. ``accept_envvar``: the node group's device plugin
    hands out GPUs with the ``envvar`` strategy, so the toolkit must honour unprivileged containers'
    ``NVIDIA_VISIBLE_DEVICES`` (every pod can then name any GPU). ``driver_root``: where the driver is on
    the host (a driver container's ``/run/nvidia/driver``), the toolkit's nvidia-container-cli root.
    ``toolkit_dir``: where NVIDIA's toolkit container installed the toolkit (``<installDir>/toolkit``): the
    nvidia runtime runs its ``nvidia-container-runtime``, and its config is the installer's, written from the
    flags the stack passes it (the driver root, the device lists), so node setup leaves it alone."""
    if not nvidia_gpus(host):
        return RuntimeResult(skipped="no-gpu")
    binary = toolkitspec.installed_runtime(toolkit_dir) if toolkit_dir else facts.NVIDIA_CONTAINER_RUNTIME
    # bad input is refused before anything (even a lock) is written
    toolkit = None if toolkit_dir else _toolkit_plan(host, accept_envvar, driver_root)
    crio = detect_runtime(host) == "crio"
    if crio:
        crio_effective_config(host)
    else:
        effective_config(host, load_config(host))
    with host.lock("runtime"):
        result = _apply_crio(host, restart, binary) if crio else _apply_runtime(host, restart, binary)
        if toolkit is not None:
            _apply_toolkit(host, toolkit, result)
        else:
            result.notes.append(f"{toolkit_dir}: the toolkit container's installer writes the toolkit's config")
        return result


@dataclass(frozen=True)
class _ToolkitPlan:
    text: str | None  #: the config as it is (None: no file)
    edited: str | None  #: what it becomes (None: the nvidia runtime is not installed, leave it)
    accept_envvar: bool


def _toolkit_doc(text: str, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ToolkitConfigError(f"{TOOLKIT_CONFIG}{what} is not valid TOML ({e}); nothing written",
                                 TOOLKIT_CONFIG) from e


def _without_ours(doc: dict[str, Any], ours: set[str], driver_root: str) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k not in ours}
    if driver_root != "/" and isinstance(out.get("nvidia-container-cli"), dict):
        cli = {k: v for k, v in out["nvidia-container-cli"].items() if k != "root"}
        out["nvidia-container-cli"] = cli
        if not cli:
            del out["nvidia-container-cli"]
    return out


def _toolkit_plan(host: HostRoot, accept_envvar: bool, driver_root: str = "/") -> _ToolkitPlan:
    """The toolkit config's edit, checked: the file parses, and the edit changes our keys (and, for a driver
    container, nvidia-container-cli's root) and nothing else."""
    text = host.read_text_or_none(TOOLKIT_CONFIG)
    if not host.is_executable(facts.NVIDIA_CONTAINER_RUNTIME):
        return _ToolkitPlan(text, None, accept_envvar)
    block = plan.toolkit_config(accept_envvar)
    before = _toolkit_doc(block_restored(block, text), "") if text is not None else {}
    edited = block_edited(block, text, {"driver_root": "" if driver_root == "/" else driver_root})
    after = _toolkit_doc(edited, " with our block added")
    ours = {facts.TOOLKIT_ENVVAR_KEY, facts.TOOLKIT_VOLUME_MOUNTS_KEY}
    if after.get("nvidia-container-cli", {}).get("root", "/") != driver_root and driver_root != "/":
        raise ToolkitConfigError(f"{TOOLKIT_CONFIG}: nvidia-container-cli's root could not be set to {driver_root} "
                                 "(is the table written in an unusual way?); set it by hand", TOOLKIT_CONFIG)
    if _without_ours(after, ours, driver_root) != _without_ours(before, ours, driver_root):
        raise ToolkitConfigError(f"{TOOLKIT_CONFIG}: setting {', '.join(sorted(ours))} would change other settings "
                                 "(are they set in an unusual way, such as quoted keys?); set them by hand",
                                 TOOLKIT_CONFIG)
    return _ToolkitPlan(text, edited, accept_envvar)


def _apply_toolkit(host: HostRoot, plan: _ToolkitPlan, result: RuntimeResult) -> None:
    if plan.edited is None:
        result.notes.append(f"{facts.NVIDIA_CONTAINER_RUNTIME} is missing: {TOOLKIT_CONFIG} left alone")
        return
    result.toolkit_accept_envvar = plan.accept_envvar
    if plan.edited != plan.text:
        local = host.path(TOOLKIT_CONFIG)
        mode = local.stat().st_mode & 0o777 if plan.text is not None else 0o644
        host.write_atomic(TOOLKIT_CONFIG, plan.edited, mode=mode)
        result.changed.append(TOOLKIT_CONFIG)


def _rollback_toolkit(host: HostRoot, result: RuntimeResult) -> None:
    """Take our block out of the toolkit config and re-enable the lines it disabled; a file that was only our
    block (there was none before) goes."""
    text = host.read_text_or_none(TOOLKIT_CONFIG)
    if text is None:
        return
    restored = block_restored(plan.toolkit_config(False), text)  # the markers, whichever lines are between
    if restored == text:
        return
    if restored.strip():
        host.write_atomic(TOOLKIT_CONFIG, restored, mode=host.path(TOOLKIT_CONFIG).stat().st_mode & 0o777)
    else:
        host.remove(TOOLKIT_CONFIG)
    result.changed.append(TOOLKIT_CONFIG)


def _conmon(host: HostRoot) -> str | None:
    """CRI-O's conmon, the first of the usual paths installed (the ``conmon`` fact)."""
    for p in facts.CONMON_PATHS:
        if host.is_executable(p):
            return p
    return None


def _toolkit_runtimes_note(host: HostRoot) -> str | None:
    """A note when the toolkit's config lists low-level runtimes of which none is installed."""
    try:
        text = host.read_text_or_none(TOOLKIT_CONFIG)
        doc = tomllib.loads(text) if text is not None else {}
    except (HostError, tomllib.TOMLDecodeError):
        return None
    names = _dig(doc, "nvidia-container-runtime", "runtimes")
    if not isinstance(names, list) or not names or any(isinstance(n, str) and host.which(n) for n in names):
        return None
    return (f"{TOOLKIT_CONFIG} lists runtimes {names!r}, none of which is installed: the nvidia runtime "
            'will not find a low-level runtime (CRI-O hosts usually want runtimes = ["crun", "runc"])')


def _apply_crio(host: HostRoot, restart: bool, binary: str = facts.NVIDIA_CONTAINER_RUNTIME) -> RuntimeResult:
    crio_effective_config(host)
    result = RuntimeResult(runtime="crio")
    chosen = choose(plan.RUNTIME_DROPIN, _facts(host, binary))
    existing = read_ours(host, chosen.path)
    if chosen.note:
        result.notes.append(chosen.note)
    if chosen.content is None:
        if existing is not None:
            result.notes.append(f"{facts.CRIO_DROPIN} from an earlier apply names the missing runtime: reinstall "
                                "the NVIDIA container toolkit or run 'runtime rollback' before CRI-O restarts")
        return result
    dropin = chosen.content
    tomllib.loads(dropin)
    note = _toolkit_runtimes_note(host)
    if note:
        result.notes.append(note)
    if existing != dropin:
        journal = Journal(host, "runtime")
        _note_edited(journal, facts.CRIO_DROPIN, existing, dropin, result, where="a drop-in of your own")
        journal.record(facts.CRIO_DROPIN)
        journal.wrote(facts.CRIO_DROPIN, dropin)
        host.write_atomic(facts.CRIO_DROPIN, dropin)
        result.changed.append(facts.CRIO_DROPIN)
    if result.changed and restart:
        restart_service(host, "crio", result)
    return result


def _apply_runtime(host: HostRoot, restart: bool, binary: str = facts.NVIDIA_CONTAINER_RUNTIME) -> RuntimeResult:
    cfg = load_config(host)
    effective_config(host, cfg)  # refuse early when a drop-in is malformed
    result = RuntimeResult(containerd_version=cfg.version, runtime="containerd")
    dropin = render_dropin(host, cfg, binary)
    tomllib.loads(dropin)
    existing = read_ours(host, cfg.dropin_path)
    new_config = None if cfg.deckhouse else with_import(cfg, IMPORT_PATTERN)
    before, after = _imports_match(cfg.text) if "imports" in cfg.doc else None, _imports_match(new_config or "")
    note = _deckhouse_case(host, cfg, binary).note
    if note:
        result.notes.append(note)
    journal = Journal(host, "runtime")
    if existing != dropin:
        where = (f"{facts.CONTAINERD_CONFIG} (the copy of its CRI section is taken again at each apply)"
                 if copies_cri_section(cfg) else "a drop-in of your own")
        if not _note_edited(journal, cfg.dropin_path, existing, dropin, result, where=where) and existing is not None:
            drift = copy_drift(cfg, existing)
            if drift:
                result.notes.append(f"{cfg.dropin_path}: copy of {facts.CONTAINERD_CONFIG}'s "
                                    f"[plugins.\"{cfg.cri_plugin}\"] refreshed: {_key_list(drift)} changed there "
                                    "since the last apply")
        journal.record(cfg.dropin_path)
        journal.wrote(cfg.dropin_path, dropin)
        host.write_atomic(cfg.dropin_path, dropin)
        result.changed.append(cfg.dropin_path)
    if new_config is not None and after is not None:  # with_import checked that its line is there
        journal.record_added_item(facts.CONTAINERD_CONFIG, "imports", IMPORT_PATTERN,
                                  before=before.group(0) if before else None, after=after.group(0))
        host.write_atomic(facts.CONTAINERD_CONFIG, new_config, mode=host.path(facts.CONTAINERD_CONFIG).stat().st_mode
                          & 0o777)
        result.changed.append(facts.CONTAINERD_CONFIG)
    if result.changed and restart:
        restart_containerd(host, result)
    return result


def _changed_keys(before: str | None, after: str) -> str:
    """The keys two versions of a TOML file differ in, for a note ("the file" when one does not parse)."""
    try:
        a, b = flatten(tomllib.loads(before or "")), flatten(tomllib.loads(after))
    except tomllib.TOMLDecodeError:
        return "the file"
    keys = [k for k in a.keys() | b.keys() if a.get(k) != b.get(k)]
    return _key_list(keys) if keys else "comments or layout"


def _note_edited(journal: Journal, path: str, existing: str | None, dropin: str, result: RuntimeResult, *,
                 where: str) -> bool:
    """Note (and return True) when someone changed our drop-in since we wrote it, before apply puts it back:
    the file is ours and is rewritten, but an edit is never dropped without a word."""
    if existing is None or not journal.changed_by_others(path, existing):
        return False
    result.notes.append(f"{path} was changed since nvidia-gpu wrote it ({_changed_keys(existing, dropin)}): "
                        f"rewritten as nvidia-gpu writes it; make lasting changes in {where}")
    return True


def rollback_runtime(host: HostRoot, *, restart: bool = True) -> RuntimeResult:
    """Undo ``apply``, exactly: remove our drop-ins (those a script wrote without a journal too), take the
    ``imports`` entry we added out of config.toml, and leave every later edit of anyone else's as it is."""
    with host.lock("runtime"):
        return _rollback_runtime(host, restart)


def _rollback_runtime(host: HostRoot, restart: bool) -> RuntimeResult:
    result = RuntimeResult()
    journal = Journal(host, "runtime")
    # Planned before anything changes: a config.toml that cannot be read stops the rollback untouched.
    new_config = _config_without_ours(host, journal, result)
    for path in sorted({*plan.RUNTIME_DROPIN.paths, PLAIN_DROPIN}):
        _remove_dropin(host, journal, path, result)
    if new_config is not None:
        mode = host.path(facts.CONTAINERD_CONFIG).stat().st_mode & 0o777
        if host.write_atomic(facts.CONTAINERD_CONFIG, new_config, mode=mode):
            result.changed.append(facts.CONTAINERD_CONFIG)
    result.changed += [p for p in journal.restore() if p not in result.changed]
    _rollback_toolkit(host, result)  # the toolkit reads it per container: no restart for it
    if result.changed and restart:  # restart whichever runtime's files changed
        if any(p.startswith(facts.CONTAINERD_DIR + "/") for p in result.changed):
            restart_containerd(host, result)
        if any(p.startswith(facts.CRIO_DIR + "/") for p in result.changed):
            restart_service(host, "crio", result)
    return result


def _remove_dropin(host: HostRoot, journal: Journal, path: str, result: RuntimeResult) -> None:
    """Remove our drop-in at ``path`` (ours: it starts with our header; its journal record, an earlier version
    of ours or none, is not put back). One someone changed since we wrote it is removed all the same, since
    it names the nvidia runtime, which teardown may take away; the edited file is kept under the state dir
    first, and a note says where."""
    journal.forget(path)
    text = host.read_text_or_none(path)
    if text is None or not text.startswith(HEADER):
        return
    if journal.changed_by_others(path, text):
        kept = host.state_path("edited", *path.strip("/").split("/"))
        host.write_atomic(kept, text, mode=0o600)
        result.notes.append(f"{path} was changed since nvidia-gpu wrote it: removed all the same (it names the "
                            f"nvidia runtime), the edited file is kept as {kept}")
    if host.remove(path):
        result.changed.append(path)


def _importers(host: HostRoot, pattern: str) -> list[str]:
    """The files an absolute ``imports`` pattern brings in (containerd globs ``*`` patterns, takes others
    as they are)."""
    if not pattern.startswith("/"):
        return []
    if not any(c in pattern for c in "*?["):
        return [pattern] if host.path(pattern).is_file() else []
    parent = pattern.rsplit("/", 1)[0] or "/"
    return [f"{parent}/{n}" for n in host.listdir(parent) if fnmatch.fnmatch(f"{parent}/{n}", pattern)]


def _legacy_item(recorded: Recorded) -> AddedItem:
    """An earlier version's journal copied all of config.toml before adding our entry: read it as the entry
    (its ``imports`` line before; after unknown), so rollback takes our item out and keeps later edits."""
    before = None
    try:
        original = recorded.content.decode() if recorded.existed else ""
        m = _imports_match(original) if "imports" in tomllib.loads(original) else None
        before = m.group(0) if m else None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        pass
    return AddedItem(path=facts.CONTAINERD_CONFIG, key="imports", item=IMPORT_PATTERN, before=before)


def _config_without_ours(host: HostRoot, journal: Journal, result: RuntimeResult) -> str | None:
    """config.toml's text without the ``imports`` entry apply added, everything else as it is now; None when
    there is nothing of ours to take out. Refuses (``ContainerdConfigError``) a config.toml that is not TOML,
    before the rollback changes anything."""
    path = facts.CONTAINERD_CONFIG
    legacy = journal.forget(path)
    items = journal.added_items(path) or ([_legacy_item(legacy)] if legacy is not None else [])
    if not items:
        return None
    text = host.read_text_or_none(path)
    if text is None:
        result.notes.append(f"{path} is gone: no imports entry to take out")
        return None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ContainerdConfigError(
            f"{path} is not valid TOML ({e}): cannot take the imports entry "
            f"{', '.join(repr(i.item) for i in items)} that nvidia-gpu added out of it; nothing was rolled back: "
            "fix the file and run rollback again", path) from e
    new = text
    for item in items:
        new, doc = _without_item(host, new, doc, item, result)
    return new if new != text else None


def _without_item(host: HostRoot, text: str, doc: dict[str, Any], item: AddedItem,
                  result: RuntimeResult) -> tuple[str, dict[str, Any]]:
    """``text`` (parsed: ``doc``) without our ``item`` in its top-level list ``item.key``: the key's text as it
    was before apply when it is still as apply wrote it, our item out of the list otherwise (the line gone
    when it is empty and was not there before). Left as it is, with a note, when someone else took the item
    out already, when files of theirs are imported through it, or when the edit cannot be made cleanly."""
    path, key = item.path, item.key
    listed = doc.get(key)
    if not isinstance(listed, list) or item.item not in listed:
        result.notes.append(f"{path}: {key} no longer lists {item.item!r}, which nvidia-gpu added (changed since "
                            "apply): left as it is")
        return text, doc
    theirs = [f for f in _importers(host, item.item) if f != PLAIN_DROPIN]
    if theirs:
        result.notes.append(f"{path}: {item.item!r}, which nvidia-gpu added to {key}, is kept: "
                            f"{', '.join(theirs)} {'is' if len(theirs) == 1 else 'are'} imported through it")
        return text, doc
    m = _imports_match(text)
    remaining = [p for p in listed if p != item.item]
    if m is None:
        result.notes.append(f"{path}: cannot locate the top-level {key} line to take {item.item!r} out of; "
                            "take it out by hand")
        return text, doc
    if item.after is not None and m.group(0) == item.after:
        replacement = item.before
    else:
        replacement = None if not remaining and item.before is None else _imports_line(remaining)
    end = m.end() + (1 if replacement is None and text[m.end():m.end() + 1] == "\n" else 0)
    new = text[:m.start()] + (replacement or "") + text[end:]
    try:
        new_doc = tomllib.loads(new)
    except tomllib.TOMLDecodeError:
        new_doc = {}
    others = {k: v for k, v in doc.items() if k != key}
    if {k: v for k, v in new_doc.items() if k != key} != others or new_doc.get(key, []) != remaining:
        result.notes.append(f"{path}: taking {item.item!r} out of {key} would change other settings; take it out "
                            "by hand")
        return text, doc
    return new, new_doc


#: What marks a directory as the toolkit NVIDIA's installer wrote (its wrapper and its config); teardown
#: removes a directory only when it finds both.
_INSTALLED_MARKERS = (toolkitspec.RUNTIME_WRAPPER, toolkitspec.CONFIG)


def installed_toolkit(host: HostRoot, toolkit_dir: str) -> bool:
    """Whether NVIDIA's toolkit container has installed the toolkit in ``toolkit_dir``."""
    d = toolkit_dir.rstrip("/")
    wrapper, config = (f"{d}/{m}" for m in _INSTALLED_MARKERS)
    return host.is_executable(wrapper) and host.exists(config)


def remove_installed_toolkit(host: HostRoot, toolkit_dir: str) -> bool:
    """Remove what NVIDIA's toolkit container installed in ``toolkit_dir`` (False: nothing of it there). A
    directory without the installer's wrapper and config is not ours to remove and is left alone."""
    d = toolkit_dir.rstrip("/")
    if not all(host.exists(f"{d}/{m}") for m in _INSTALLED_MARKERS):
        return False
    host.remove_tree(d)
    return True
