"""A small JSON client for the Kubernetes API: server-side apply, dry-run, discovery, TokenRequest.

The harness and the preview's dry-run use it instead of the official client's typed classes because
they handle arbitrary kinds (custom resources included) from rendered manifests, and need the API
server's own refusal message verbatim, with the object named, when it rejects one.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"


class ApiError(RuntimeError):
    """The API server refused a call: ``status`` is the HTTP status, ``message`` the server's words."""

    def __init__(self, what: str, status: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(f"{what}: {status} {reason}: {message}")
        self.what = what
        self.status = status
        self.reason = reason
        self.message = message
        self.details = details or {}


@dataclass(frozen=True)
class Resource:
    """Where a kind lives: the plural resource name and whether it is namespaced."""

    group_version: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{urllib.parse.quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{urllib.parse.quote(name)}"
        return base


#: The field manager of objects this harness applies (a stack applied by the tests, as `pulumi up` would).
APPLY_FIELD_MANAGER = "nvidia-gpu-tests"


@dataclass
class Kube:
    """An authenticated connection to one API server (bearer token, CA-verified TLS)."""

    server: str
    token: str
    ca_file: Path | None = None
    timeout: float = 30.0
    client_cert: Path | None = None
    client_key: Path | None = None
    verify: bool = True
    _discovery: dict[tuple[str, str], Resource] = field(default_factory=dict, repr=False)
    _ctx: ssl.SSLContext | None = field(default=None, repr=False)
    #: ``(what, text)`` of every ``Warning`` header the server sent (deprecated fields, Pod Security).
    warnings: list[tuple[str, str]] = field(default_factory=list, repr=False)

    @classmethod
    def from_kubeconfig(cls, path: str | Path, context: str | None = None) -> Kube:
        """A context of any kubeconfig (token, client certificate or exec plugin), read by the official
        client's loader so users' own kubeconfigs work as ``kubectl`` reads them."""
        from kubernetes import client, config  # noqa: PLC0415 - the whole official client, on this path only

        cfg = client.Configuration()
        loader: Any = config
        loader.load_kube_config(config_file=str(path), context=context, client_configuration=cfg)
        auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken") or ""
        token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
        return cls(server=str(cfg.host).rstrip("/"), token=token,
                   ca_file=Path(cfg.ssl_ca_cert) if cfg.ssl_ca_cert else None,
                   client_cert=Path(cfg.cert_file) if cfg.cert_file else None,
                   client_key=Path(cfg.key_file) if cfg.key_file else None,
                   verify=bool(cfg.verify_ssl))

    def with_token(self, token: str) -> Kube:
        """The same server as another identity."""
        return Kube(server=self.server, token=token, ca_file=self.ca_file, timeout=self.timeout)

    def _context(self) -> ssl.SSLContext:
        if self._ctx is None:
            ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            if self.client_cert:
                ctx.load_cert_chain(str(self.client_cert), str(self.client_key) if self.client_key else None)
            if not self.verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ctx = ctx
        return self._ctx

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                query: dict[str, str] | None = None, what: str | None = None,
                timeout: float | None = None) -> Any:
        """One call; answers the decoded JSON body, raises :class:`ApiError` with the server's message."""
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data: bytes | None = None
        if body is not None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._context(), timeout=timeout or self.timeout) as resp:
                raw = resp.read()
                for text in resp.headers.get_all("Warning") or []:
                    self.warnings.append((what or f"{method} {path}", _warning_text(text)))
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                status = json.loads(raw)
            except ValueError:
                status = {"message": raw.decode(errors="replace")}
            raise ApiError(what or f"{method} {path}", e.code, str(status.get("reason", e.reason)),
                           str(status.get("message", "")), status.get("details")) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")  # /readyz, /healthz and logs answer plain text

    # --- discovery -------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Resource:
        """The resource serving ``kind`` in ``api_version``; re-reads discovery once on a miss (new CRDs)."""
        key = (api_version, kind)
        if key not in self._discovery:
            self._discover(api_version)
        if key not in self._discovery:
            raise ApiError(f"{kind} {api_version}", 404, "NotFound",
                           f"the server has no resource for kind {kind!r} in {api_version!r}")
        return self._discovery[key]

    def _discover(self, api_version: str) -> None:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            doc = self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return
            raise
        for r in doc.get("resources", []):
            if "/" in r["name"]:
                continue
            self._discovery[(api_version, r["kind"])] = Resource(api_version, r["name"], bool(r["namespaced"]))

    def forget_discovery(self) -> None:
        self._discovery.clear()

    # --- objects ---------------------------------------------------------------------------

    def _where(self, obj: dict[str, Any]) -> tuple[Resource, str | None, str]:
        meta = obj.get("metadata") or {}
        res = self.resource(obj["apiVersion"], obj["kind"])
        return res, (meta.get("namespace") or "default") if res.namespaced else None, meta.get("name", "")

    def apply(self, obj: dict[str, Any], *, field_manager: str = APPLY_FIELD_MANAGER, force: bool = True,
              dry_run: bool = False) -> Any:
        """Server-side apply ``obj`` (create or update); ``dry_run`` runs admission and validation only."""
        res, ns, name = self._where(obj)
        query = {"fieldManager": field_manager}
        if force:
            query["force"] = "true"
        if dry_run:
            query["dryRun"] = "All"
        return self.request("PATCH", res.path(ns, name), json.dumps(obj), content_type=APPLY_PATCH, query=query,
                            what=describe(obj))

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Any:
        return self.request("GET", self.resource(api_version, kind).path(namespace, name))

    def get_or_none(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Any:
        try:
            return self.get(api_version, kind, name, namespace)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None = None, **query: str) -> list[Any]:
        doc = self.request("GET", self.resource(api_version, kind).path(namespace), query=query or None)
        return list(doc.get("items") or [])

    def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> Any:
        res, ns, _ = self._where(obj)
        return self.request("POST", res.path(ns), obj, query={"dryRun": "All"} if dry_run else None,
                            what=describe(obj))

    def patch(self, api_version: str, kind: str, name: str, body: dict[str, Any], namespace: str | None = None,
              *, content_type: str = MERGE_PATCH, subresource: str = "") -> Any:
        path = self.resource(api_version, kind).path(namespace, name) + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, body, content_type=content_type)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               *, missing_ok: bool = True, **query: str) -> Any:
        try:
            return self.request("DELETE", self.resource(api_version, kind).path(namespace, name),
                                query=query or None)
        except ApiError as e:
            if missing_ok and e.status == 404:
                return None
            raise

    def token_for(self, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
        """A bound token for a ServiceAccount (TokenRequest), as the kubelet would mount into its pod."""
        doc = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": seconds}},
                           what=f"TokenRequest for {namespace}/{service_account}")
        return str(doc["status"]["token"])

    def can_i(self, verb: str, resource: str, *, group: str = "", namespace: str = "", name: str = "",
              subresource: str = "") -> bool:
        """SelfSubjectAccessReview as this identity: what the authorizer would answer."""
        attrs = {"verb": verb, "resource": resource, "group": group, "namespace": namespace, "name": name,
                 "subresource": subresource}
        doc = self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                           {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                            "spec": {"resourceAttributes": {k: v for k, v in attrs.items() if v}}})
        return bool(doc["status"].get("allowed"))

    def kubeconfig_text(self, user: str = "user") -> str:
        """A kubeconfig for this identity (for agents started as processes)."""
        cluster: dict[str, Any] = {"server": self.server}
        if self.ca_file:
            cluster["certificate-authority"] = str(self.ca_file)
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": user,
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": user, "user": {"token": self.token}}],
            "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
        })


def _warning_text(header: str) -> str:
    """The text of an RFC 7234 ``Warning: 299 - "text"`` header."""
    parts = header.split(" ", 2)
    text = parts[2] if len(parts) == 3 else header
    return text.strip().strip('"')


def describe(obj: dict[str, Any]) -> str:
    """``Kind namespace/name`` for messages."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"
