"""Where the agent's API credentials come from: one loader for every agent process and command.

In order:

1. ``--kubeconfig PATH`` when given (tests, development, a node's admin file);
2. the pod's ServiceAccount when ``KUBERNETES_SERVICE_HOST`` is set (the DaemonSets), through the
   official client's in-cluster loader, which re-reads the projected token every minute (kubelet
   rotates it; a token read once expires after an hour);
3. otherwise ``$KUBECONFIG`` (its first existing file) or ``~/.kube/config``: a command run by hand.

Kubeconfigs are read here, not with ``kubernetes.config.load_kube_config``: that loader imports requests,
oauthlib and the whole client package (+19 MiB, see :mod:`node_agent.kube.official`). What the agent's
kubeconfigs carry is read here: a bearer token or token file, a client certificate (files or inline
data), the CA (file or inline), ``insecure-skip-tls-verify`` and ``tls-server-name``; relative paths
are relative to the kubeconfig, as kubectl reads them. A user with ``exec`` or ``auth-provider``
credentials (cloud logins, only on a hand-run command) is handed to the official loader, paying its
memory only then.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from node_agent.kube import official
from node_agent.kube.errors import NoCredentials

#: Where kubelet mounts the pod's ServiceAccount token and the cluster CA.
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")


def load(kubeconfig: str | Path | None = None, *, service_account: Path = SERVICE_ACCOUNT,
         environ: Mapping[str, str] | None = None) -> Any:
    """A ``kubernetes.client.Configuration`` from the first source that applies (see the module docs).

    Raises :class:`~node_agent.kube.errors.NoCredentials` naming the source when it cannot be used.
    """
    env = os.environ if environ is None else environ
    if kubeconfig:
        return from_kubeconfig(Path(kubeconfig))
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(service_account, env)
    return from_kubeconfig(default_kubeconfig(env))


def default_kubeconfig(environ: Mapping[str, str]) -> Path:
    """``$KUBECONFIG``'s first existing file (kubectl merges the list; the agent takes the first), else
    ``~/.kube/config``."""
    for entry in (environ.get("KUBECONFIG") or "").split(os.pathsep):
        if entry and Path(entry).expanduser().is_file():
            return Path(entry).expanduser()
    return DEFAULT_KUBECONFIG.expanduser()


def in_cluster(service_account: Path = SERVICE_ACCOUNT, environ: Mapping[str, str] | None = None) -> Any:
    """The pod's ServiceAccount, through the official in-cluster loader (token re-read every minute)."""
    cfg = official.Configuration()
    loader = official.InClusterConfigLoader(
        token_filename=str(service_account / "token"), cert_filename=str(service_account / "ca.crt"),
        environ=dict(os.environ if environ is None else environ))
    try:
        loader.load_and_set(cfg)
    except (official.ConfigException, OSError) as e:
        raise NoCredentials(f"no in-cluster credentials ({service_account}): {e}") from e
    return cfg


def from_kubeconfig(path: Path) -> Any:
    """The current context of the kubeconfig at ``path``."""
    import yaml  # noqa: PLC0415 - only with a kubeconfig: the in-pod path never loads it

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise NoCredentials(f"kubeconfig {path}: {e}") from e
    if not isinstance(doc, dict):
        raise NoCredentials(f"kubeconfig {path}: not a mapping")
    context = _named(path, doc, "contexts", doc.get("current-context"))
    cluster = _named(path, doc, "clusters", context.get("cluster"))
    user = _named(path, doc, "users", context.get("user")) if context.get("user") else {}
    if {"exec", "auth-provider"} & set(user):
        return _official_kubeconfig(path)
    server = str(cluster.get("server") or "")
    if not server:
        raise NoCredentials(f"kubeconfig {path}: the cluster has no server")
    cfg = official.Configuration()
    cfg.host = server.rstrip("/")

    def local(value: object) -> str:
        p = Path(str(value)).expanduser()
        return str(p if p.is_absolute() else path.parent / p)

    if cluster.get("certificate-authority"):
        cfg.ssl_ca_cert = local(cluster["certificate-authority"])
    elif cluster.get("certificate-authority-data"):
        cfg.ssl_ca_cert = _data_file(cluster["certificate-authority-data"], "ca.crt")
    if cluster.get("insecure-skip-tls-verify"):
        cfg.verify_ssl = False
    if cluster.get("tls-server-name"):
        cfg.tls_server_name = str(cluster["tls-server-name"])
    if user.get("client-certificate"):
        cfg.cert_file = local(user["client-certificate"])
    elif user.get("client-certificate-data"):
        cfg.cert_file = _data_file(user["client-certificate-data"], "client.crt")
    if user.get("client-key"):
        cfg.key_file = local(user["client-key"])
    elif user.get("client-key-data"):
        cfg.key_file = _data_file(user["client-key-data"], "client.key")
    if user.get("token"):
        cfg.api_key["BearerToken"] = f"Bearer {user['token']}"
    elif user.get("tokenFile"):
        _token_file(cfg, Path(local(user["tokenFile"])))
    return cfg


def _named(path: Path, doc: Mapping[str, Any], section: str, name: object) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return dict(entry.get(section[:-1]) or {})
    raise NoCredentials(f"kubeconfig {path}: no {section[:-1]} named {name!r}")


def _token_file(cfg: Any, token_file: Path) -> None:
    """Re-read the token file before each call (it may be rotated, as a projected token is)."""

    def refresh(c: Any) -> None:
        with contextlib.suppress(OSError):  # keep the last token; the API server says 401 if it no longer holds
            c.api_key["BearerToken"] = f"Bearer {token_file.read_text().strip()}"

    refresh(cfg)
    cfg.refresh_api_key_hook = refresh


_data_dir: Path | None = None


def _data_file(data: object, name: str) -> str:
    """Inline base64 data written to a private file: urllib3 and ``ssl`` load certificates from files."""
    global _data_dir
    if _data_dir is None:
        _data_dir = Path(tempfile.mkdtemp(prefix="node-agent-kube-"))
        atexit.register(shutil.rmtree, _data_dir, True)
    target = _data_dir / name
    try:
        target.write_bytes(base64.b64decode(str(data)))
    except (ValueError, OSError) as e:
        raise NoCredentials(f"kubeconfig: bad {name} data: {e}") from e
    target.chmod(0o600)
    return str(target)


def _official_kubeconfig(path: Path) -> Any:
    """Exec-plugin and auth-provider users, through ``kubernetes.config.load_kube_config`` (its full import).

    The agent image leaves out the client's API classes and models (57 MB; see node_agent/Dockerfile):
    in a pod the agent uses its ServiceAccount, and an exec plugin's binary (aws, gcloud, kubelogin) is
    not in the image either. There this path says so instead of failing with an import error."""
    try:
        from kubernetes import config  # noqa: PLC0415 - the whole client, on this path only (not in the image)
    except ImportError as e:
        raise NoCredentials(f"kubeconfig {path}: its user needs an exec plugin or auth provider, which needs the "
                            f"full kubernetes client; this installation has only its transport ({e}). Use a "
                            "token or client-certificate kubeconfig, or the pod's ServiceAccount") from e

    kube_config: Any = config  # its loaders have no type hints

    cfg = official.Configuration()
    try:
        kube_config.load_kube_config(config_file=str(path), client_configuration=cfg)
    except (kube_config.ConfigException, OSError) as e:
        raise NoCredentials(f"kubeconfig {path}: {e}") from e
    return cfg
