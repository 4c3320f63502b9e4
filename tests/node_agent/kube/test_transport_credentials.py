"""node_agent.kube against a loopback API stand-in: error classes, bounded calls, and where credentials come from."""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from node_agent.kube import credentials, errors
from node_agent.kube.transport import Kube
from tests.kit.loopback_api import LoopbackApi, LoopbackPki, Seen, make_test_pki

NODE = "/api/v1/nodes/n1"


@pytest.fixture
def api() -> Iterator[LoopbackApi]:
    server = LoopbackApi()
    yield server
    server.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LoopbackPki:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_api(pki: LoopbackPki) -> Iterator[LoopbackApi]:
    server = LoopbackApi(tls=pki.server_context())
    server.routes[("GET", NODE)] = (200, {"metadata": {"name": "n1"}})
    yield server
    server.close()


# -- errors ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("status", "cls"), [
    (400, errors.BadRequest), (401, errors.Unauthorized), (403, errors.Forbidden), (404, errors.NotFound),
    (405, errors.MethodNotAllowed), (409, errors.Conflict), (410, errors.Gone), (422, errors.Invalid),
    (429, errors.TooManyRequests), (500, errors.ServerError), (503, errors.ServerError),
])
def test_statuses_become_classes_with_the_servers_message(api: LoopbackApi, status: int,
                                                           cls: type[errors.KubeError]) -> None:
    api.routes[("GET", NODE)] = (status, {"kind": "Status", "code": status, "message": f"said {status}"})
    with pytest.raises(cls) as caught:
        Kube.for_url(api.url).get(NODE, what="read node n1")
    assert caught.value.status == status
    assert str(caught.value) == f"read node n1: {status} said {status}"


def test_an_unlisted_status_is_a_plain_kube_error(api: LoopbackApi) -> None:
    api.routes[("GET", NODE)] = (418, b"teapot")
    with pytest.raises(errors.KubeError) as caught:
        Kube.for_url(api.url).get(NODE)
    assert type(caught.value) is errors.KubeError and caught.value.status == 418


def test_no_json_is_a_bad_response_with_the_cause(api: LoopbackApi) -> None:
    api.routes[("GET", NODE)] = (200, b"<html>a proxy</html>")
    with pytest.raises(errors.BadResponse) as caught:
        Kube.for_url(api.url).get(NODE)
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_refused_connection_is_unreachable_with_the_cause() -> None:
    with pytest.raises(errors.Unreachable) as caught:
        Kube.for_url("http://127.0.0.1:9").get(NODE)
    assert caught.value.status is None and caught.value.__cause__ is not None


def test_a_frozen_server_costs_one_read_timeout_not_four(api: LoopbackApi) -> None:
    """urllib3 would retry the read three times; RETRIES allows none (callers have their own loops)."""

    def freeze(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        time.sleep(1.5)

    api.routes[("GET", NODE)] = freeze
    kube = Kube.for_url(api.url, timeout=(1.0, 0.3))
    t0 = time.monotonic()
    with pytest.raises(errors.Unreachable):
        kube.get(NODE)
    assert time.monotonic() - t0 < 1.0
    assert len(api.requests("GET", NODE)) == 1


def test_calls_send_json_and_merge_patch_and_are_counted(api: LoopbackApi) -> None:
    api.routes[("PATCH", NODE)] = (200, {"metadata": {"name": "n1", "labels": {"a": "1"}}})
    api.routes[("POST", "/api/v1/namespaces/default/events")] = (201, {})
    api.routes[("DELETE", NODE)] = (200, {})
    kube = Kube.for_url(api.url)
    assert kube.merge_patch(NODE, {"metadata": {"labels": {"a": "1", "b": None}}})["metadata"]["labels"] == {"a": "1"}
    kube.create("/api/v1/namespaces/default/events", {"reason": "R"})
    kube.delete(NODE)
    patch, post, delete = api.seen
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert patch.body == {"metadata": {"labels": {"a": "1", "b": None}}}
    assert post.headers["content-type"] == "application/json" and post.body == {"reason": "R"}
    assert delete.body is None and kube.calls == 3


# -- credentials -------------------------------------------------------------------------------------------------
def _kubeconfig(path: Path, cluster: Mapping[str, object], user: Mapping[str, object]) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_in_cluster_from_the_service_account_dir_and_env(tls_api: LoopbackApi, pki: LoopbackPki,
                                                         tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token")
    (sa / "ca.crt").write_bytes(pki.pki.ca_cert.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(tls_api.port)}
    cfg = credentials.load(None, service_account=sa, environ=env)
    Kube(cfg).get(NODE)
    assert tls_api.seen[-1].headers["authorization"] == "bearer pod-token"


def test_in_cluster_without_a_token_says_so(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(errors.NoCredentials, match="token file does not exist"):
        credentials.load(None, service_account=tmp_path, environ=env)


def test_kubeconfig_with_client_certificate_files_relative_to_it(pki: LoopbackPki, tmp_path: Path) -> None:
    server = LoopbackApi(tls=pki.server_context(require_client_cert=True))
    server.routes[("GET", NODE)] = (200, {"metadata": {"name": "n1"}})
    try:
        for name, src in (("ca.crt", pki.pki.ca_cert), ("c.crt", pki.client_cert), ("c.key", pki.client_key)):
            (tmp_path / name).write_bytes(src.read_bytes())
        path = _kubeconfig(tmp_path / "kubeconfig", {"server": server.url, "certificate-authority": "ca.crt"},
                           {"client-certificate": "c.crt", "client-key": "c.key"})
        Kube.connect(path).get(NODE)
        assert server.seen[-1].client_subject == "system:node-agent"
        assert "authorization" not in server.seen[-1].headers
    finally:
        server.close()


def test_kubeconfig_with_inline_data_and_a_token(pki: LoopbackPki, tls_api: LoopbackApi, tmp_path: Path) -> None:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cluster = {"server": tls_api.url, "certificate-authority-data": b64(pki.pki.ca_cert)}
    path = _kubeconfig(tmp_path / "kubeconfig", cluster,
                       {"token": "t0k3n", "client-certificate-data": b64(pki.client_cert),
                        "client-key-data": b64(pki.client_key)})
    cfg = credentials.load(path)
    Kube(cfg).get(NODE)
    assert tls_api.seen[-1].headers["authorization"] == "Bearer t0k3n"
    assert tls_api.seen[-1].client_subject == "system:node-agent"
    assert stat.S_IMODE(os.stat(cfg.key_file).st_mode) == 0o600  # the key written out is private


def test_a_token_file_is_read_again_for_each_call(api: LoopbackApi, tmp_path: Path) -> None:
    api.routes[("GET", NODE)] = (200, {})
    (tmp_path / "token").write_text("first\n")
    kube = Kube.connect(_kubeconfig(tmp_path / "kubeconfig", {"server": api.url}, {"tokenFile": "token"}))
    kube.get(NODE)
    (tmp_path / "token").write_text("rotated\n")
    kube.get(NODE)
    assert [s.headers["authorization"] for s in api.seen] == ["Bearer first", "Bearer rotated"]


def test_a_wrong_ca_is_unreachable_not_silently_trusted(tls_api: LoopbackApi, tmp_path: Path) -> None:
    other = make_test_pki(tmp_path / "other")
    cluster = {"server": tls_api.url, "certificate-authority": str(other.pki.ca_cert)}
    path = _kubeconfig(tmp_path / "kubeconfig", cluster, {"token": "x"})
    with pytest.raises(errors.Unreachable):
        Kube.connect(path).get(NODE)
    assert tls_api.seen == []


def test_default_kubeconfig_for_commands_run_by_hand(api: LoopbackApi, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a pod and without --kubeconfig: $KUBECONFIG's first existing file, else ~/.kube/config."""
    api.routes[("GET", NODE)] = (200, {})
    listed = _kubeconfig(tmp_path / "listed", {"server": api.url}, {"token": "from-env"})
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    _kubeconfig(home / ".kube" / "config", {"server": api.url}, {"token": "from-home"})
    monkeypatch.setenv("HOME", str(home))
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), str(listed)])}
    Kube(credentials.load(None, environ=env)).get(NODE)
    Kube(credentials.load(None, environ={})).get(NODE)
    assert [s.headers["authorization"] for s in api.seen] == ["Bearer from-env", "Bearer from-home"]


def test_exec_plugin_users_go_to_the_official_loader(api: LoopbackApi, tmp_path: Path) -> None:
    api.routes[("GET", NODE)] = (200, {})
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": "from-exec"}}
    (tmp_path / "cred.json").write_text(json.dumps(credential))
    path = _kubeconfig(tmp_path / "kubeconfig", {"server": api.url}, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "cat", "args": [str(tmp_path / "cred.json")],
        "interactiveMode": "Never"}})
    Kube.connect(path).get(NODE)
    assert api.seen[-1].headers["authorization"] == "Bearer from-exec"


def test_exec_plugin_users_are_refused_by_name_where_the_full_client_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent image removes the client's API classes and models: its kubeconfig loader cannot import."""
    path = _kubeconfig(tmp_path / "kubeconfig", {"server": "https://127.0.0.1:1"}, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "aws", "interactiveMode": "Never"}})
    real_import = __import__

    def no_models(name: str, *args: object, **kwargs: object) -> object:
        if name == "kubernetes" and args and "config" in (args[2] or ()):  # type: ignore[operator]
            raise ModuleNotFoundError("No module named 'kubernetes.client.models'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("builtins.__import__", no_models)
    with pytest.raises(errors.NoCredentials, match=r"needs an exec plugin or auth provider, which needs the full "
                                                   r"kubernetes client.*kubernetes.client.models"):
        credentials.load(path)


@pytest.mark.parametrize(("text", "message"), [
    ("[]", "not a mapping"),
    ("current-context: nope\ncontexts: []\n", "no context named 'nope'"),
    ("current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {}}]\n",
     "the cluster has no server"),
])
def test_unusable_kubeconfigs_are_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "kubeconfig").write_text(text)
    with pytest.raises(errors.NoCredentials, match=message):
        credentials.load(tmp_path / "kubeconfig")
    with pytest.raises(errors.NoCredentials, match="missing"):
        credentials.load(tmp_path / "missing")
