"""``python -m localcluster up|down|status``: the loopback control plane behind ``make cluster-up``;
``python -m localcluster node add|remove|reboot|list [NAME]``: real nodes joined to it (root only).

``up`` starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok in the
background (they outlive this command), installs the CRDs a Deckhouse cluster has (Deckhouse's
NodeGroups and NodeGroupConfigurations, and the Prometheus Operator's monitors and rules that its
monitoring modules bring), and prints how long start-up took and where the cluster-admin kubeconfig
is; ``down`` removes the real nodes, stops them and removes the state directory.

``node add NAME [--machine dgx-h100] [--image ARCHIVE ...]`` starts containerd and a kubelet in namespaces of
their own (a GPU node with ``--machine``), with
state under ``DIR/nodes/NAME/`` (:mod:`localcluster.node`), imports the pause image (built here) and each
OCI/Docker ``ARCHIVE`` into its containerd, and waits for the Node to be Ready; ``node remove NAME`` leaves
nothing of it behind (processes, mounts, cgroups, files) and deletes the Node object; ``node reboot NAME`` does
to it what a reboot does (:meth:`localcluster.node.Node.reboot`) and waits for it to be Ready again.
Exit status: 0 ok, 1 failure (the component's log tail is printed), 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from localcluster.controlplane import REPO, ControlPlane, ToolsMissing
from localcluster.dryrun import install_crds, server_version
from localcluster.images import ImageError
from localcluster.node import MACHINES, Node, NodeError, add_node, remove_node, wait_ready

DEFAULT_DIR = REPO / "out" / "cluster"
#: The CRDs the offline preview validates against (nvidia_gpu/preview/crds, with their SOURCES.md).
PLATFORM_CRDS = sorted((REPO / "nvidia_gpu" / "preview" / "crds").glob("*.yaml"))


def node_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster node", description="real nodes (root only)")
    parser.add_argument("action", choices=("add", "remove", "reboot", "list"))
    parser.add_argument("name", nargs="?")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state directory (default: {DEFAULT_DIR})")
    parser.add_argument("--image", type=Path, action="append", default=[],
                        help="an OCI or Docker image archive to import into the node's containerd (repeatable)")
    parser.add_argument("--machine", choices=sorted(MACHINES),
                        help="a GPU node: the machine's driver (NVIDIA's go-nvml model as its NVML) and device nodes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for Ready (default: 120)")
    args = parser.parse_args(argv)
    directory: Path = args.dir.resolve()
    if args.action != "list" and not args.name:
        parser.error(f"node {args.action} needs a NAME")
    if not (directory / "state.json").exists():
        print(f"no control plane in {directory} (run `make cluster-up`)", file=sys.stderr)
        return 1
    cp = ControlPlane.attach(directory)
    if args.action == "list":
        for node in Node.all(directory):
            print(f"{node.name}\t{node.ip}\t{node.pod_cidr}\t{node.directory}")
        return 0
    if os.geteuid() != 0:
        print("a real node needs root (namespaces, mounts, cgroups)", file=sys.stderr)
        return 1
    if args.action == "remove":
        if not remove_node(directory, args.name, cp.admin() if cp.alive() else None):
            print(f"no node {args.name} in {directory}")
            return 1
        print(f"node {args.name} removed")
        return 0
    if args.action == "reboot":
        try:
            boot_id = Node.attach(directory, args.name).reboot()
            waited = wait_ready(cp.admin(), args.name, timeout=args.timeout, boot_id=boot_id)
        except (OSError, ValueError, NodeError, TimeoutError) as e:
            print(f"node {args.name} reboot failed: {e}", file=sys.stderr)
            return 1
        print(f"node {args.name} rebooted, Ready again after {waited:.1f} s")
        return 0
    if not cp.alive():
        print(f"control plane in {directory} is not running (run `make cluster-down` then `make cluster-up`)",
              file=sys.stderr)
        return 1
    assert cp.bin_dir is not None
    missing = [b for b in ("containerd", "containerd-shim-runc-v2", "ctr", "crictl", "kubelet", "runc", "cni")
               if not (cp.bin_dir / b).exists()]
    if missing:
        print(f"{cp.bin_dir} lacks {', '.join(missing)}: run `make tools`", file=sys.stderr)
        return 1
    try:
        node = add_node(directory, args.name, cp.bin_dir, cp.admin(), images=[i.resolve() for i in args.image],
                        machine=args.machine, timeout=args.timeout)
    except (NodeError, ImageError, TimeoutError) as e:
        print(f"node {args.name} failed: {e}", file=sys.stderr)
        return 1
    print(f"node {node.name} Ready: IP {node.ip}, pods {node.pod_cidr}; state and logs in {node.directory}")
    print(f"containerd (inside the node): {' '.join(node.ctr())} images ls")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["node"]:
        return node_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.splitlines()[0],
                                     epilog="python -m localcluster node --help: real nodes")
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state directory (default: {DEFAULT_DIR})")
    parser.add_argument("--no-platform-crds", action="store_true",
                        help="do not install the Deckhouse and Prometheus Operator CRDs")
    args = parser.parse_args(argv)
    directory: Path = args.dir.resolve()

    if args.command == "down":
        if not (directory / "state.json").exists():
            print(f"no control plane in {directory}")
            return 0
        nodes = [n.name for n in Node.all(directory)]
        ControlPlane.attach(directory).stop(remove=True)  # removes the nodes first
        print(f"stopped{'; removed nodes ' + ', '.join(nodes) if nodes else ''}; removed {directory}")
        return 0

    if args.command == "status":
        if not (directory / "state.json").exists():
            print(f"no control plane in {directory}")
            return 1
        cp = ControlPlane.attach(directory)
        if not cp.alive():
            print(f"control plane in {directory} is not running (run `make cluster-down` then `make cluster-up`)")
            return 1
        print(f"running: {server_version(cp.admin())} at {cp.server}; kubeconfig {cp.kubeconfig}")
        return 0

    if (directory / "state.json").exists():
        cp = ControlPlane.attach(directory)
        if cp.alive():
            print(f"already running at {cp.server}; kubeconfig {cp.kubeconfig}")
            return 0
        cp.stop(remove=True)
    try:
        cp = ControlPlane(directory=directory).start(detach=True)
    except ToolsMissing as e:
        print(e, file=sys.stderr)
        return 1
    except (RuntimeError, TimeoutError) as e:
        print(f"control plane failed to start: {e}", file=sys.stderr)
        return 1
    if not args.no_platform_crds:
        install_crds(cp.admin(), PLATFORM_CRDS)
    print(f"control plane {server_version(cp.admin())} up in {cp.startup_s:.1f} s at {cp.server} "
          f"(etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, netproxy)")
    print(f"kubeconfig (cluster-admin): {cp.kubeconfig}")
    print(f"logs: {directory / 'logs'}; stop with `make cluster-down`; "
          f"real nodes (root): python -m localcluster node add NAME")
    return 0


if __name__ == "__main__":
    sys.exit(main())
