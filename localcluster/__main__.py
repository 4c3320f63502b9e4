"""``python -m localcluster up|down|status``: the loopback control plane behind ``make cluster-up``.

``up`` starts etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok in the
background (they outlive this command), installs the CRDs a Deckhouse cluster has (Deckhouse's
NodeGroups and NodeGroupConfigurations, and the Prometheus Operator's monitors and rules that its
monitoring modules bring), and prints how long start-up took and where the cluster-admin kubeconfig
is; ``down`` stops them and removes the state directory.
Exit status: 0 ok, 1 failure (the component's log tail is printed), 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localcluster.controlplane import REPO, ControlPlane, ToolsMissing
from localcluster.dryrun import install_crds, server_version

DEFAULT_DIR = REPO / "out" / "cluster"
#: The CRDs the offline preview validates against (nvidia_gpu/preview/crds, with their SOURCES.md).
PLATFORM_CRDS = sorted((REPO / "nvidia_gpu" / "preview" / "crds").glob("*.yaml"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.splitlines()[0])
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
        ControlPlane.attach(directory).stop(remove=True)
        print(f"stopped; removed {directory}")
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
          f"(etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)")
    print(f"kubeconfig (cluster-admin): {cp.kubeconfig}")
    print(f"logs: {directory / 'logs'}; stop with `make cluster-down`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
