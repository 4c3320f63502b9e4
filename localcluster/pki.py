"""Certificates and keys for a loopback control plane, made with the ``openssl`` command.

The API server needs a serving certificate its clients can verify (a throwaway CA, SANs for
127.0.0.1 and localhost) and an RSA key pair to sign and check ServiceAccount tokens, because the
agents authenticate with TokenRequest tokens exactly as they do in their pods.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {done.stderr.strip()}")


def make_pki(directory: Path) -> Pki:
    """Create (or reuse, when complete) the CA, serving pair and ServiceAccount keys in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt", ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt", serving_key=directory / "apiserver.key",
        sa_key=directory / "sa.key", sa_pub=directory / "sa.pub",
    )
    if all(p.exists() for p in (pki.ca_cert, pki.serving_cert, pki.sa_pub)):
        return pki
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=nvidia-gpu-test-ca",
             "-keyout", str(pki.ca_key), "-out", str(pki.ca_cert))
    csr = directory / "apiserver.csr"
    ext = directory / "apiserver.ext"
    # 10.96.0.1: the `kubernetes` Service's address (the first of SERVICE_CIDR), which in-cluster clients
    # on a real node dial and verify (the node's netns forwards it to this server).
    ext.write_text("subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
                   "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", str(pki.serving_key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
             "-CAcreateserial", "-days", "30", "-extfile", str(ext), "-out", str(pki.serving_cert))
    _openssl("genrsa", "-out", str(pki.sa_key), "2048")
    _openssl("rsa", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))
    return pki


def client_pair(directory: Path, ca: Pki, name: str, *, cn: str, org: str) -> tuple[Path, Path]:
    """A client certificate and key ``directory/NAME.{crt,key}`` signed by ``ca`` (made once, then reused)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    if cert.exists() and key.exists():
        return cert, key
    ext, csr = directory / f"{name}.ext", directory / f"{name}.csr"
    ext.write_text("extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/O={org}/CN={cn}",
             "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.ca_cert), "-CAkey", str(ca.ca_key), "-CAcreateserial",
             "-days", "30", "-extfile", str(ext), "-out", str(cert))
    return cert, key
