"""The eviction guard (``node_agent.admission``): its decision, its certificate, its HTTPS server.

The API server's side is tested in ``tests/cluster/test_agent_mig.py``; here the review is built as the
API server sends it (``admission.k8s.io/v1``) and the server is called over real TLS on loopback.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from node_agent.admission import certificates
from node_agent.admission.eviction import judge
from node_agent.admission.review import AdmissionReview
from node_agent.admission.server import EvictionGuard, GuardSettings
from node_agent.kube.errors import NotFound, Unreachable
from nvgpu import evictionguard as contract

MANAGER = "system:serviceaccount:nvidia-gpu:mig-manager"
PODS = {("work", "here"): "node-a", ("work", "there"): "node-b", ("work", "pending"): ""}


def pod_node(namespace: str, name: str) -> str:
    try:
        return PODS[(namespace, name)]
    except KeyError:
        raise NotFound(f"pod {namespace}/{name} not found", 404) from None


def review(name: str = "here", *, node: str | None = "node-a", sub: str = "eviction", op: str = "CREATE",
           dry_run: bool = False) -> dict[str, Any]:
    extra = {contract.NODE_CLAIM: [node]} if node is not None else {}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": sub,
        "name": name, "namespace": "work", "operation": op, "dryRun": dry_run,
        "userInfo": {"username": MANAGER, "groups": ["system:serviceaccounts"], "extra": extra},
        "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}}}


def verdict(body: dict[str, Any]) -> tuple[bool, int, str]:
    v = judge(AdmissionReview.model_validate(body).request, pod_node)
    return v.allowed, v.code, v.message


def test_a_pod_on_the_callers_node_may_be_evicted_dry_run_or_not() -> None:
    assert verdict(review()) == (True, 200, "")
    assert verdict(review(dry_run=True)) == (True, 200, "")


def test_a_pod_on_another_node_or_on_none_is_refused_naming_both_nodes() -> None:
    assert verdict(review("there")) == (False, 403, contract.denial("node-a", "work", "there", "node-b"))
    allowed, code, message = verdict(review("pending"))
    assert (allowed, code) == (False, 403) and message.endswith("not work/pending bound to no node")


def test_a_token_without_its_pods_node_is_refused() -> None:
    for claim in (None, ""):
        allowed, code, message = verdict(review(node=claim))
        assert (allowed, code) == (False, 403) and contract.NODE_CLAIM in message and MANAGER in message


def test_a_missing_pod_passes_and_an_unreadable_one_is_refused() -> None:
    assert verdict(review("gone"))[0] is True  # the eviction itself answers 404

    def down(namespace: str, name: str) -> str:
        raise Unreachable("connection refused")

    v = judge(AdmissionReview.model_validate(review()).request, down)
    assert (v.allowed, v.code) == (False, 500) and "cannot read pod work/here" in v.message


def test_only_create_pods_eviction_is_judged() -> None:
    assert verdict(review(sub="status"))[:2] == (False, 400)
    assert verdict(review(op="DELETE"))[:2] == (False, 400)


def test_the_certificate_names_the_service_and_is_signed_by_its_ca() -> None:
    hosts = (*contract.service_hosts("gpu-system"), "127.0.0.1")
    now = dt.datetime.now(dt.UTC)
    cert = certificates.generate(hosts, now=now)
    leaf = x509.load_pem_x509_certificate(cert.cert)
    ca = x509.load_pem_x509_certificate(cert.ca)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == set(hosts[:-1])
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.due(now) and cert.due(now + certificates.VALIDITY - dt.timedelta(days=1))
    with pytest.raises(ValueError, match="at least one host"):
        certificates.generate(())


class FakeKube:
    """The one configuration the guard keeps trusting it; records the patches."""

    def __init__(self) -> None:
        self.hooks: list[dict[str, Any]] = [{"name": "other", "clientConfig": {}},
                                            {"name": contract.WEBHOOK_NAME, "clientConfig": {"url": "x"}}]
        self.patches: list[Any] = []

    def get_object(self, path: str, **_: Any) -> dict[str, Any]:
        return {"webhooks": self.hooks}

    def request(self, method: str, path: str, body: Any, **kw: Any) -> None:
        self.patches.append((method, kw["content_type"], kw["query"], body))
        self.hooks[1]["clientConfig"]["caBundle"] = body[1]["value"]


def test_the_ca_bundle_is_patched_in_its_webhook_only_and_only_when_it_differs() -> None:
    kube = FakeKube()
    assert certificates.sync_ca_bundle(kube, "cfg", b"CA") is True  # type: ignore[arg-type]
    assert certificates.sync_ca_bundle(kube, "cfg", b"CA") is False  # type: ignore[arg-type]
    ((method, ctype, query, patch),) = kube.patches
    assert (method, ctype, query) == ("PATCH", certificates.JSON_PATCH, {"fieldManager": contract.FIELD_MANAGER})
    assert patch[0] == {"op": "test", "path": "/webhooks/1/name", "value": contract.WEBHOOK_NAME}
    assert patch[1]["path"] == "/webhooks/1/clientConfig/caBundle"
    kube.hooks.pop()
    with pytest.raises(NotFound, match=contract.WEBHOOK_NAME):
        certificates.sync_ca_bundle(kube, "cfg", b"CA")  # type: ignore[arg-type]


@pytest.fixture
def guard(tmp_path: Path) -> Iterator[EvictionGuard]:
    settings = GuardSettings(namespace="nvidia-gpu", configuration="cfg", hosts=("127.0.0.1",),
                             listen=("127.0.0.1", 0), retry_s=0.05)
    g = EvictionGuard(settings, FakeKube(), pod_node=pod_node)  # type: ignore[arg-type]
    (tmp_path / "ca.crt").write_bytes(g.cert.ca)
    g.start()
    assert g.trusted.wait(5)
    yield g
    g.stop()


def call(g: EvictionGuard, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cadata=g.cert.ca.decode())
    conn = http.client.HTTPSConnection("127.0.0.1", g.port, context=context, timeout=5)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_the_server_answers_reviews_over_tls_with_the_api_servers_format(guard: EvictionGuard) -> None:
    status, body = call(guard, "POST", contract.WEBHOOK_PATH, json.dumps(review("there")).encode())
    assert status == 200 and body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == "u-1" and body["response"]["allowed"] is False
    assert body["response"]["status"] == {"code": 403, "reason": "Forbidden",
                                          "message": contract.denial("node-a", "work", "there", "node-b")}
    status, body = call(guard, "POST", contract.WEBHOOK_PATH, json.dumps(review()).encode())
    assert (status, body["response"]) == (200, {"uid": "u-1", "allowed": True})
    assert guard.decisions == 2


def test_what_is_not_a_review_is_a_400_never_an_allow(guard: EvictionGuard) -> None:
    status, body = call(guard, "POST", contract.WEBHOOK_PATH, b'{"kind": "AdmissionReview"}')
    assert status == 400 and "apiVersion" in body["error"]
    assert call(guard, "POST", "/elsewhere", b"{}")[0] == 404
    assert guard.decisions == 0


def test_probes(guard: EvictionGuard) -> None:
    assert call(guard, "GET", "/healthz") == (200, {"status": "ok"})
    assert call(guard, "GET", "/readyz") == (200, {"status": "ok"})


@pytest.fixture
def small_guard() -> Iterator[EvictionGuard]:
    settings = GuardSettings(namespace="nvidia-gpu", configuration="cfg", hosts=("127.0.0.1",),
                             listen=("127.0.0.1", 0), retry_s=0.05, max_connections=4, idle_timeout_s=0.5)
    g = EvictionGuard(settings, FakeKube(), pod_node=pod_node)  # type: ignore[arg-type]
    g.start()
    assert g.trusted.wait(5)
    yield g
    g.stop()


def _tls_client(g: EvictionGuard) -> ssl.SSLSocket:
    context = ssl.create_default_context(cadata=g.cert.ca.decode())
    return context.wrap_socket(socket.create_connection(("127.0.0.1", g.port), timeout=5), server_hostname="127.0.0.1")


def test_connections_beyond_the_cap_are_closed_and_the_guard_still_answers(small_guard: EvictionGuard) -> None:
    """A flood of clients that connect and say nothing: the guard serves its cap, closes the rest at once,
    and answers the API server again as soon as a slot is free."""
    held = [_tls_client(small_guard) for _ in range(4)]
    extra = socket.create_connection(("127.0.0.1", small_guard.port), timeout=5)
    try:
        assert extra.recv(1) == b""  # closed by the guard, without a TLS handshake
        for c in held:
            c.close()
        deadline = time.monotonic() + 5
        while True:
            try:
                assert call(small_guard, "GET", "/readyz") == (200, {"status": "ok"})
                break
            except (ConnectionError, ssl.SSLError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        extra.close()
        for c in held:
            c.close()


def test_an_idle_or_stalled_client_is_closed(small_guard: EvictionGuard) -> None:
    client = _tls_client(small_guard)
    try:
        client.sendall(b"POST " + contract.WEBHOOK_PATH.encode() + b" HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        t0 = time.monotonic()
        assert client.recv(1) == b""  # the guard gave up on the rest of the body
        assert time.monotonic() - t0 < 5
    finally:
        client.close()


def test_a_client_that_goes_away_mid_request_is_no_traceback(small_guard: EvictionGuard,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(3):
        client = _tls_client(small_guard)
        client.sendall(b"POST " + contract.WEBHOOK_PATH.encode() + b" HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        client.close()
    time.sleep(1.0)  # past the idle timeout: every connection thread has ended
    assert "Traceback" not in capsys.readouterr().err
    assert call(small_guard, "GET", "/healthz")[0] == 200
