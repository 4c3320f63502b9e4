"""Reads this node's device-plugin config label and notices when the chosen config changes.

The node label ``nvidia.com/device-plugin.config`` names one of the configs mounted from the
components' ConfigMap. :class:`ConfigWatcher` checks the selection and the mounted files every few
seconds, and at once when the label watch (``node_agent.deviceplugin.nodewatch``) reports a change,
and asks for a reload when the selection or its content changes, which is NVIDIA's config-manager
sidecar folded into the plugin. Plain ``urllib`` requests with the pod's service account (or the
``--kubeconfig`` the agent was given) keep the plugin's memory small (the kubernetes client alone costs
about 18 MiB).
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import ssl
import tempfile
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from node_agent.deviceplugin.named import DEFAULT_FALLBACKS, NamedConfigError, Selection, available_configs, select

log = logging.getLogger(__name__)

CONFIG_LABEL = "nvidia.com/device-plugin.config"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class LabelSource(Protocol):
    def label(self) -> str | None:
        """The label's current value (``None`` when unset); raises ``OSError`` when unreadable."""
        ...


class ApiEndpoint:
    """The API server as the pod sees it: base URL, CA and the service-account token (re-read per request).

    With ``kubeconfig`` (the agent's ``--kubeconfig``) the server, CA and credentials come from that file's
    current context instead, as for every other agent command, so the plugin run outside a pod (or with
    another identity) watches with the identity it was given rather than failing on a missing mount.
    """

    def __init__(self, server: str | None = None, account_dir: Path = SERVICE_ACCOUNT, *,
                 kubeconfig: Path | None = None):
        self.account_dir = account_dir
        self._token_file: Path | None = account_dir / "token"
        self._token: str | None = None
        if kubeconfig is not None:
            access = _kubeconfig_access(kubeconfig)
            self.server = (server or access.server).rstrip("/")
            self._token, self._token_file, self._ctx = access.token, access.token_file, access.context
            return
        if server is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise OSError("not running in a cluster (KUBERNETES_SERVICE_HOST is unset)")
            server = f"https://{host}:{port}"
        self.server = server.rstrip("/")
        ca = account_dir / "ca.crt"
        self._ctx = ssl.create_default_context(cafile=str(ca)) if server.startswith("https") else None

    def open(self, path: str, timeout_s: float) -> Any:
        """GET ``path`` (with its query); the caller closes the response. HTTP errors raise ``HTTPError``."""
        token = self._token
        if self._token_file is not None:
            token = self._token_file.read_text().strip()  # re-read: projected tokens rotate
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.server + path, headers=headers)
        return urllib.request.urlopen(req, timeout=timeout_s, context=self._ctx)


@dataclass(frozen=True)
class _Access:
    server: str
    context: ssl.SSLContext | None
    token: str | None
    token_file: Path | None


def _kubeconfig_access(path: Path) -> _Access:
    """Server, TLS context and bearer token (or token file) of ``path``'s current context.

    What the agent's kubeconfigs use (tests, development, a node's admin file): a token, a token file or a
    client certificate, files relative to the kubeconfig as ``kubectl`` reads them. Exec plugins and auth
    providers would need the kubernetes client this module avoids: refused with a message, not ignored.
    """
    import yaml  # only when a kubeconfig is given: the in-pod path never loads it

    def named(doc: dict[str, Any], section: str, name: object) -> dict[str, Any]:
        for entry in doc.get(section) or []:
            if entry.get("name") == name:
                return dict(entry.get(section[:-1]) or {})
        raise OSError(f"kubeconfig {path}: no {section[:-1]} named {name!r}")

    def local(value: object) -> Path:
        p = Path(str(value))
        return p if p.is_absolute() else path.parent / p

    try:
        doc = yaml.safe_load(path.read_text())
        if not isinstance(doc, dict):
            raise OSError(f"kubeconfig {path}: not a mapping")
        context = named(doc, "contexts", doc.get("current-context"))
        cluster = named(doc, "clusters", context.get("cluster"))
        user = named(doc, "users", context.get("user")) if context.get("user") else {}
    except yaml.YAMLError as e:
        raise OSError(f"kubeconfig {path}: {e}") from e
    unsupported = sorted({"exec", "auth-provider"} & set(user))
    if unsupported:
        raise OSError(f"kubeconfig {path}: {unsupported[0]} credentials are not supported by the node label "
                      "watch (use a token, a token file or a client certificate)")
    server = str(cluster.get("server") or "")
    if not server:
        raise OSError(f"kubeconfig {path}: the cluster has no server")
    ctx: ssl.SSLContext | None = None
    if server.startswith("https"):
        ca_data = cluster.get("certificate-authority-data")
        ca_file = cluster.get("certificate-authority")
        ctx = ssl.create_default_context(
            cafile=str(local(ca_file)) if ca_file else None,
            cadata=base64.b64decode(ca_data).decode() if ca_data else None)
        if cluster.get("insecure-skip-tls-verify"):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        _load_client_cert(ctx, user, local)
    token_file = user.get("tokenFile")
    return _Access(server, ctx, str(user["token"]) if user.get("token") else None,
                   local(token_file) if token_file else None)


def _load_client_cert(ctx: ssl.SSLContext, user: Mapping[str, Any], local: Callable[[object], Path]) -> None:
    """The user's client certificate, from files or inline data (``load_cert_chain`` reads files only)."""
    if user.get("client-certificate"):
        key = user.get("client-key")
        ctx.load_cert_chain(str(local(user["client-certificate"])), str(local(key)) if key else None)
    elif user.get("client-certificate-data"):
        with tempfile.TemporaryDirectory() as tmp:
            cert, key_path = Path(tmp) / "cert", Path(tmp) / "key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key_path.write_bytes(base64.b64decode(user.get("client-key-data") or ""))
            ctx.load_cert_chain(str(cert), str(key_path) if user.get("client-key-data") else None)


def node_label(node: Mapping[str, Any], key: str) -> str | None:
    """A label's value from a Node object as JSON (``None`` when unset)."""
    value = (node.get("metadata") or {}).get("labels", {}).get(key)
    return str(value) if value is not None else None


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def add_config_source_arguments(g: argparse._ActionsContainer) -> None:
    """The flags naming where the device-plugin config comes from (NVIDIA's plugin and config-manager spell
    them so, and read the same environment variables). The device plugin and the labeller share them, so
    the labeller reads the very config the plugin serves (:func:`config_selector`)."""
    g.add_argument("--config-file", type=Path, default=_env_path("CONFIG_FILE"))
    g.add_argument("--config-dir", type=Path, default=_env_path("CONFIG_FILE_SRCDIR"),
                   help="directory of named configs (one file per name), chosen by the node label")
    g.add_argument("--config-label", default=os.environ.get("CONFIG_LABEL") or CONFIG_LABEL,
                   help=f"node label naming the config in --config-dir (default {CONFIG_LABEL})")
    g.add_argument("--default-config", default=os.environ.get("DEFAULT_CONFIG") or None)
    g.add_argument("--fallback-strategies", default=os.environ.get("FALLBACK_STRATEGIES", ",".join(DEFAULT_FALLBACKS)))


def config_selector(args: argparse.Namespace, labels: LabelSource | None) -> ConfigSelector:
    """The selector for the flags of :func:`add_config_source_arguments`."""
    fallbacks = [s.strip() for s in args.fallback_strategies.split(",") if s.strip()]
    return ConfigSelector(args.config_file, args.config_dir, labels, args.default_config, fallbacks)


class ConfigSelector:
    """Chooses the config text: a fixed file, or a named config picked by the node label."""

    def __init__(self, config_file: Path | None = None, config_dir: Path | None = None,
                 labels: LabelSource | None = None, default: str | None = None,
                 fallbacks: Sequence[str] = DEFAULT_FALLBACKS):
        self.config_file = config_file
        self.config_dir = config_dir
        self.labels = labels
        self.default = default
        self.fallbacks = tuple(fallbacks)
        self.current: Selection | None = None
        self._last_label: str | None = None

    def _label(self) -> str | None:
        if self.labels is None:
            return None
        try:
            self._last_label = self.labels.label()
        except OSError as e:  # API hiccup: keep the last known label, do not flap
            log.warning("event=label-read-failed error=%s", e)
        return self._last_label

    def select(self) -> Selection:
        if self.config_dir is None:
            path = self.config_file
            return Selection(path.name if path else None, path, "file" if path else "none")
        available = available_configs(self.config_dir)
        label = self._label()
        try:
            return select(available, label, self.default, self.fallbacks)
        except NamedConfigError as e:
            if self.current is not None or not label or label in available:
                raise  # running: the watcher keeps the current config and says why
            # Starting with a label that names no config: serve the default (as if unlabelled) and
            # say so, instead of failing to start (NVIDIA's plugin skips such a label too).
            log.error("event=config-label-unknown label=%s action=use-default error=%s", label, e)
            return select(available, None, self.default, self.fallbacks)

    def read(self) -> tuple[Selection, str | None]:
        sel = self.select()
        text = sel.read()
        self.current = sel
        return sel, text


class ConfigWatcher:
    """Polls the selection and content; calls ``on_change`` when either differs from the last read."""

    def __init__(self, selector: ConfigSelector, on_change: Callable[[str], None], interval_s: float = 5.0):
        self.selector = selector
        self.on_change = on_change
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="config-watch", daemon=True)
        self._seen: tuple[str | None, str | None] | None = None

    def remember(self, selection: Selection, text: str | None) -> None:
        self._seen = (selection.name, text)

    def poll(self) -> bool:
        try:
            sel = self.selector.select()
            text = sel.read()
        except (NamedConfigError, OSError) as e:
            log.error("event=config-selection-failed error=%s action=keep-current", e)
            return False
        if self._seen is not None and (sel.name, text) != self._seen:
            log.info("event=config-changed name=%s reason=%s", sel.name, sel.reason)
            self._seen = (sel.name, text)
            self.on_change("config-changed")
            return True
        self._seen = (sel.name, text)
        return False

    def wake(self) -> None:
        """Check now instead of at the next interval (the node label watch saw the label change)."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.poll()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
