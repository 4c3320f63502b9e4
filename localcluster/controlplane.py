"""Start, wait for, restart and stop a loopback control plane from the pinned binaries.

Every component listens on 127.0.0.1 only, on ports picked free at start, with its state under one
directory, so several control planes (parallel test runs, ``make cluster-up`` beside a test run) can
coexist. Identities are static bearer tokens for the control-plane components and the admin, and
TokenRequest tokens for the agents (:meth:`localcluster.client.Kube.token_for`).

Real nodes (:mod:`localcluster.node`, ``python -m localcluster node add``) live in network namespaces of
their own; :mod:`localcluster.netproxy`, started and stopped with the API server, is the only path between
them and the host's loopback. The API server therefore always gets an egress selector (its "cluster"
traffic, to kubelets, goes through the proxy's unix socket; the proxy dials anything that is not a node
from the host, so nothing changes without nodes), a client certificate for the kubelets
(``system:masters``, so their webhook authorizer allows logs and exec) and the cluster CA to verify their
serving certificates. :meth:`ControlPlane.stop` removes the nodes first.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster.client import ApiError, Kube
from localcluster.node import Node
from localcluster.pki import Pki, client_pair, make_pki
from localcluster.processes import alive, stop_child, stop_pid

REPO = Path(__file__).resolve().parent.parent
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
BINARIES = (*COMPONENTS, "kwok-stages.yaml")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
#: Processes beside the components: the proxy between the host and the real nodes (started before the API
#: server, whose egress selector needs it, and stopped last).
NETPROXY = "netproxy"
#: The longest path a unix socket address holds (``sun_path``: 108 bytes with the terminating NUL).
UNIX_PATH_MAX = 107


class ToolsMissing(RuntimeError):
    """The pinned binaries are not built (``make tools``)."""


def tools_bin(*, build: bool = False) -> Path:
    """The directory holding the pinned binaries: ``$NVIDIA_GPU_TOOLS_BIN``, else the build cache.

    ``build`` runs ``tools/build.sh`` (minutes when cold) instead of only looking the cache up.
    """
    env = os.environ.get("NVIDIA_GPU_TOOLS_BIN")
    if env:
        path = Path(env)
        missing = [c for c in BINARIES if not (path / c).exists()]
        if missing:
            raise ToolsMissing(f"NVIDIA_GPU_TOOLS_BIN={env} lacks {', '.join(missing)}")
        return path
    cmd = ["bash", str(REPO / "tools" / "build.sh")] + ([] if build else ["--print"])
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if build else subprocess.PIPE, text=True,
                          check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise ToolsMissing("the pinned control plane is not built: run `make tools` "
                           f"({(done.stderr or '').strip() or 'tools/build.sh failed'})")
    return Path(done.stdout.strip().splitlines()[-1])


#: Starts tried when a port picked free is taken before its component binds it.
PORT_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ControlPlane:
    """One control plane in ``directory``; :meth:`start` brings it up, :meth:`stop` tears it down.

    ``components`` chooses what runs: the preview's dry-run needs only etcd and the API server, the
    placement and agent tests also the scheduler, the controller-manager and kwok.
    """

    directory: Path
    components: tuple[str, ...] = COMPONENTS
    bin_dir: Path | None = None
    feature_gates: str = ""
    #: More flags for kube-apiserver (a benchmark's audit log).
    apiserver_args: tuple[str, ...] = ()
    ports: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    startup_s: float = 0.0
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _pki: Pki | None = field(default=None, repr=False)

    # --- paths ---------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def admin(self) -> Kube:
        assert self._pki is not None
        return Kube(server=self.server, token=self.tokens["admin"], ca_file=self._pki.ca_cert)

    def log(self, component: str) -> Path:
        return self.directory / "logs" / f"{component}.log"

    @property
    def nodes_dir(self) -> Path:
        """Where :class:`localcluster.node.Node` keeps each real node (``nodes/NAME/``)."""
        return self.directory / "nodes"

    @property
    def egress_socket(self) -> Path:
        """The proxy's socket for the API server's egress: in the state directory when its path fits a unix
        socket address (107 bytes), else in the temporary directory under a name derived from the state
        directory's (a checkout in a deep directory, a test's temporary one)."""
        path = self.directory.resolve() / "egress.sock"
        if len(str(path).encode()) <= UNIX_PATH_MAX:
            return path
        key = hashlib.sha256(str(self.directory.resolve()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"localcluster-{key}.sock"

    # --- lifecycle -----------------------------------------------------------------------

    def start(self, *, timeout: float = 120.0, detach: bool = False) -> ControlPlane:
        """Start every component, wait for the API server and (with them) scheduler/controllers/kwok.

        ``detach`` puts the processes in their own session so they outlive this Python process
        (``make cluster-up``); :meth:`stop` or ``python -m localcluster down`` ends them.
        """
        started = time.monotonic()
        if self.bin_dir is None:
            self.bin_dir = tools_bin()
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        self._pki = make_pki(self.directory / "pki")
        for user in ("admin", "kube-scheduler", "kube-controller-manager", "kwok"):
            self.tokens.setdefault(user, secrets.token_hex(16))
        fixed = dict(self.ports)  # ports the caller chose are kept; the others are picked free
        for attempt in range(1, PORT_ATTEMPTS + 1):
            for name in ("etcd", "etcd-peer", "apiserver", "kwok"):
                self.ports[name] = fixed.get(name) or free_port()
            self._write_auth()
            self._write_node_access()
            try:
                self._spawn("etcd", detach)
                self._spawn(NETPROXY, detach)
                self._spawn("kube-apiserver", detach)
                self.wait_ready(timeout=timeout)
                for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
                    if name in self.components:
                        self._spawn(name, detach)
                self._wait_components(timeout=timeout)
                break
            except RuntimeError as e:
                self.stop(remove=False)
                # A port picked free was taken by another process before the component bound it (two
                # clones starting clusters at once): pick again.
                if "address already in use" not in str(e) or attempt == PORT_ATTEMPTS:
                    raise
                shutil.rmtree(self.directory / "etcd", ignore_errors=True)  # it knows its old peer URL
            except BaseException:
                self.stop(remove=False)
                raise
        self.startup_s = time.monotonic() - started
        self._save_state()
        return self

    def _write_auth(self) -> None:
        assert self._pki is not None
        groups = {"admin": "system:masters", "kwok": "system:masters", "kube-scheduler": "",
                  "kube-controller-manager": ""}
        users = {"admin": "admin", "kwok": "kwok", "kube-scheduler": "system:kube-scheduler",
                 "kube-controller-manager": "system:kube-controller-manager"}
        lines = [f'{self.tokens[k]},{users[k]},{users[k]},"{groups[k]}"' if groups[k]
                 else f"{self.tokens[k]},{users[k]},{users[k]}" for k in users]
        (self.directory / "tokens.csv").write_text("\n".join(lines) + "\n")
        os.chmod(self.directory / "tokens.csv", 0o600)
        for user in users:
            path = self.kubeconfig if user == "admin" else self.directory / f"{user}.kubeconfig"
            kube = Kube(server=self.server, token=self.tokens[user], ca_file=self._pki.ca_cert)
            path.write_text(kube.kubeconfig_text(user))
            os.chmod(path, 0o600)

    def _write_node_access(self) -> None:
        """The egress selector file and the API server's client pair for kubelets (see the module docstring)."""
        assert self._pki is not None
        client_pair(self.directory / "pki", self._pki, "apiserver-kubelet-client",
                    cn="kube-apiserver-kubelet-client", org="system:masters")
        self.nodes_dir.mkdir(exist_ok=True)
        (self.directory / "egress.yaml").write_text(json.dumps({
            "apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
            "egressSelections": [{"name": "cluster", "connection": {
                "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(self.egress_socket)}}}}]},
            indent=1))

    def _command(self, name: str) -> list[str]:
        assert self._pki is not None and self.bin_dir is not None
        d, p, pki = self.directory, self.ports, self._pki
        binary = str(self.bin_dir / name)
        if name == NETPROXY:
            return [sys.executable, "-m", "localcluster.netproxy", "--uds", str(self.egress_socket),
                    "--api", f"127.0.0.1:{p['apiserver']}", "--nodes-dir", str(self.nodes_dir)]
        if name == "etcd":
            peer = f"http://127.0.0.1:{p['etcd-peer']}"
            client = f"http://127.0.0.1:{p['etcd']}"
            return [binary, "--name", "default", "--data-dir", str(d / "etcd"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"default={peer}", "--listen-metrics-urls", "",
                    "--unsafe-no-fsync", "--log-level", "warn", "--quota-backend-bytes", str(2 << 30)]
        if name == "kube-apiserver":
            cmd = [binary, "--etcd-servers", f"http://127.0.0.1:{p['etcd']}",
                   "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                   "--secure-port", str(p["apiserver"]),
                   "--tls-cert-file", str(pki.serving_cert), "--tls-private-key-file", str(pki.serving_key),
                   "--client-ca-file", str(pki.ca_cert),
                   "--token-auth-file", str(d / "tokens.csv"),
                   "--authorization-mode", "Node,RBAC",
                   "--enable-admission-plugins", "NodeRestriction",
                   "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
                   "--service-account-key-file", str(pki.sa_pub),
                   "--service-account-signing-key-file", str(pki.sa_key),
                   "--service-cluster-ip-range", SERVICE_CIDR,
                   "--endpoint-reconciler-type", "none",
                   "--allow-privileged=true", "--profiling=false", "--enable-priority-and-fairness=false",
                   "--egress-selector-config-file", str(d / "egress.yaml"),
                   # No kube-proxy anywhere, so no ClusterIP answers: a webhook or aggregated API behind a
                   # Service is dialled at one of its endpoints (a pod IP, which the netproxy routes into the
                   # pod's node), as on clusters whose control plane cannot reach Service IPs.
                   "--enable-aggregator-routing=true",
                   "--kubelet-client-certificate", str(d / "pki" / "apiserver-kubelet-client.crt"),
                   "--kubelet-client-key", str(d / "pki" / "apiserver-kubelet-client.key"),
                   "--kubelet-certificate-authority", str(pki.ca_cert),
                   "--v=1"]
            if self.feature_gates:
                cmd += ["--feature-gates", self.feature_gates]
            return [*cmd, *self.apiserver_args]
        if name == "kube-controller-manager":
            return [binary, "--kubeconfig", str(d / "kube-controller-manager.kubeconfig"),
                    "--leader-elect=false", "--use-service-account-credentials=true",
                    "--service-account-private-key-file", str(pki.sa_key), "--root-ca-file", str(pki.ca_cert),
                    "--bind-address", "127.0.0.1", "--secure-port", "0",
                    "--service-cluster-ip-range", SERVICE_CIDR, "--profiling=false",
                    "--controllers", "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route",
                    "--concurrent-daemonset-syncs", "4", "--v=1"]
        if name == "kube-scheduler":
            return [binary, "--kubeconfig", str(d / "kube-scheduler.kubeconfig"),
                    "--authentication-kubeconfig", str(d / "kube-scheduler.kubeconfig"),
                    "--authorization-kubeconfig", str(d / "kube-scheduler.kubeconfig"),
                    "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0",
                    "--profiling=false", "--v=1"]
        if name == "kwok":
            return [binary, "--kubeconfig", str(d / "kwok.kubeconfig"),
                    "--config", str(self.bin_dir / "kwok-stages.yaml"), "--node-lease-duration-seconds", "40",
                    "--manage-nodes-with-annotation-selector", f"{KWOK_ANNOTATION}=fake",
                    "--cidr", "10.244.0.1/16", "--node-ip", "10.0.0.1",
                    "--server-address", f"127.0.0.1:{p['kwok']}"]
        raise ValueError(name)

    def _spawn(self, name: str, detach: bool) -> None:
        log = self.log(name).open("ab")
        env = None
        if name == NETPROXY:  # the module from this checkout, whatever the caller's working directory
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen(self._command(name), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=self.directory, start_new_session=detach, env=env)
        log.close()
        self._procs[name] = proc
        self.pids[name] = proc.pid

    def wait_ready(self, *, timeout: float = 120.0) -> None:
        """Until ``/readyz`` answers ok (etcd reachable, bootstrap RBAC and priority classes in place)."""
        deadline = time.monotonic() + timeout
        kube = self.admin()
        last = ""
        while time.monotonic() < deadline:
            self._check_alive("etcd", "kube-apiserver")
            try:
                kube.request("GET", "/readyz", timeout=5)
                kube.request("GET", "/api/v1/namespaces/default", timeout=5)
                return
            except (ApiError, OSError) as e:
                last = str(e)
            time.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready after {timeout:.0f} s ({last}); see {self.log('kube-apiserver')}")

    def _wait_components(self, *, timeout: float) -> None:
        """Until the controllers and scheduler have done their first work (default ServiceAccount)."""
        kube = self.admin()
        deadline = time.monotonic() + timeout
        if "kube-controller-manager" in self.components:
            while kube.get_or_none("v1", "ServiceAccount", "default", "default") is None:
                self._check_alive(*self._procs)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no default ServiceAccount after {timeout:.0f} s; "
                                       f"see {self.log('kube-controller-manager')}")
                time.sleep(0.2)
        self._check_alive(*self._procs)

    def _check_alive(self, *names: str) -> None:
        for name in names:
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is not None:
                tail = self.log(name).read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n" + "\n".join(tail))

    def stop_component(self, name: str, *, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``: kube-apiserver 1.34 can hang for 15 s and more after
        "HTTPServerStoppedListening" while controllers hold watches, and a test cluster has nothing
        to drain (etcd keeps every write it acknowledged)."""
        proc = self._procs.pop(name, None)
        if proc is not None:
            stop_child(proc, grace_s)
        else:
            stop_pid(self.pids.get(name), grace_s)
        self.pids.pop(name, None)

    def restart_apiserver(self, *, down_s: float = 0.0, timeout: float = 120.0) -> float:
        """Stop the API server, wait ``down_s``, start it on the same port; answers the seconds it was down.

        Once it is ready, the controller manager and the scheduler are restarted too, as a control-plane
        node's kubelet restarts them: with leader election on (as in real clusters) they lose their lease
        during the outage and exit. Here leader election is off, and a controller manager that lived
        through the restart kept the watches the restarted server refused (403 while its authorizer was
        still syncing) for minutes: DaemonSet pods the MIG manager waited on were never removed.
        """
        t0 = time.monotonic()
        self.stop_component("kube-apiserver")
        time.sleep(down_s)
        self._spawn("kube-apiserver", detach=False)
        self.wait_ready(timeout=timeout)
        down = time.monotonic() - t0
        for name in ("kube-controller-manager", "kube-scheduler"):
            if name in self.components:
                self.stop_component(name)
                self._spawn(name, detach=False)
        self._save_state()
        return down

    def stop(self, *, remove: bool = True) -> None:
        """Remove every real node (a node without its control plane is of no use, and its mounts, cgroups and
        processes must not outlive the cluster), stop every component (reverse order) and the proxy;
        ``remove`` deletes the state directory."""
        for node in Node.all(self.directory):
            node.remove()
        for name in (*reversed(COMPONENTS), NETPROXY):
            if name in self._procs or name in self.pids:
                self.stop_component(name)
        self.egress_socket.unlink(missing_ok=True)
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)

    # --- state for `python -m localcluster` -----------------------------------------------

    def _save_state(self) -> None:
        state = {"ports": self.ports, "tokens": self.tokens, "pids": self.pids, "components": list(self.components),
                 "bin_dir": str(self.bin_dir), "startup_s": round(self.startup_s, 2)}
        path = self.directory / "state.json"
        path.write_text(json.dumps(state, indent=2))
        os.chmod(path, 0o600)

    @classmethod
    def attach(cls, directory: Path) -> ControlPlane:
        """The control plane ``cluster-up`` left running in ``directory`` (raises if there is none)."""
        state: dict[str, Any] = json.loads((directory / "state.json").read_text())
        cp = cls(directory=directory, components=tuple(state["components"]), bin_dir=Path(state["bin_dir"]),
                 ports=state["ports"], tokens=state["tokens"], pids=state["pids"], startup_s=state["startup_s"])
        cp._pki = make_pki(directory / "pki")
        return cp

    def alive(self) -> bool:
        return all(alive(pid) for pid in self.pids.values()) and bool(self.pids)
