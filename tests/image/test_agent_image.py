"""The agent image, built as an air-gapped site builds it (``node_agent/image/build.sh``: a debootstrap base,
buildah with ``node_agent/Dockerfile``, no registry), then run on a simulated node.

Inside the image, as its default user where the DaemonSets run it so, with the repository's simulated machines
(``nvml_sim``, which the image leaves out) mounted at ``/app/nvml_sim``: ``sim host`` lays out a DGX H100 under
``/host``, ``runtime apply`` (root, as the setup pod) configures its containerd, ``check --json`` says ``ok``
and ``labels`` prints the GPU count. The image holds the agent and its runtime dependencies only: no pip,
setuptools, Pulumi, tests, the simulator or the kubernetes client's API classes. Its size is printed (``-s``) and the
figures are in ``bench/bench_image_size.py``.

Needs root, buildah and debootstrap (``.ci/run`` installs them); ``make test`` turns a skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kit.tools import missing

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "node_agent" / "image" / "build.sh"
TAG = "localhost/nvidia-gpu-agent:test"
#: The simulated machines, which the image leaves out: mounted at /app/nvml_sim to run it on a simulated node.
SIMULATOR = REPO / "nvml_sim"
#: Where a Debian host keeps the local CAs its pip trusts (a proxy's, a private index's).
LOCAL_CAS = Path("/usr/local/share/ca-certificates")


@dataclass
class Image:
    storage: list[str]
    tag: str
    build_log: str

    def buildah(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["buildah", *self.storage, *args], capture_output=True, text=True, timeout=300,
                              check=check)

    def run(self, host: Path, *argv: str, user: str | None = None,
            simulator: bool = False) -> subprocess.CompletedProcess[str]:
        """``argv`` in a container of the image (its entrypoint bypassed), ``host`` at ``/host``; ``simulator``:
        the repository's simulated machines mounted where the agent imports them (the image leaves them out)."""
        ctr = self.buildah("from", "--quiet", self.tag).stdout.strip()
        try:
            opts = ["--isolation", "chroot", "-v", f"{host}:/host", *(["--user", user] if user else []),
                    *(["-v", f"{SIMULATOR}:/app/nvml_sim:ro"] if simulator else [])]
            return self.buildah("run", *opts, ctr, "--", *argv, check=False)
        finally:
            self.buildah("rm", ctr, check=False)

    def agent(self, host: Path, *args: str, user: str | None = None,
              simulator: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(host, "python", "-m", "node_agent", "--host-root", "/host", "--nvml", "simulated:dgx-h100",
                        *args, user=user, simulator=simulator)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    if os.geteuid() != 0:
        missing("the image test needs root (buildah's chroot isolation)")
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            missing(f"the image test needs {tool}: apt-get install buildah debootstrap (make deps does)")
    storage = tmp_path_factory.mktemp("buildah")
    env = dict(os.environ, BUILDAH_ROOT=str(storage))
    if list(LOCAL_CAS.glob("*.crt")):
        env["CA_DIR"] = str(LOCAL_CAS)
    done = subprocess.run(["bash", str(BUILD), TAG], capture_output=True, text=True, env=env, timeout=1500,
                          check=False)
    assert done.returncode == 0, f"build.sh failed:\n{done.stderr[-6000:]}"
    img = Image(["--storage-driver", "vfs", "--root", str(storage / "root"), "--runroot", str(storage / "run")], TAG,
                done.stderr)
    try:
        yield img
    finally:
        img.buildah("rm", "--all", check=False)
        shutil.rmtree(storage, ignore_errors=True)


def _size_mb(image: Image, tag: str) -> float:
    """The size ``buildah images`` shows (its layers uncompressed, as ``docker images``), in MB."""
    number, unit = json.loads(image.buildah("images", "--json", tag).stdout)[0]["size"].split()
    return float(number) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[unit]


@pytest.mark.timeout(1800)
def test_the_image_runs_the_agent_on_a_simulated_node(image: Image, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir(mode=0o777)
    host.chmod(0o777)
    laid = image.agent(host, "--json", "sim", "host", user="0:0")
    assert laid.returncode == 0, laid.stderr
    assert json.loads(laid.stdout)["gpus"] == 8
    applied = image.agent(host, "runtime", "apply", user="0:0")  # the setup pod runs as root
    assert applied.returncode == 0, applied.stderr
    for path in host.rglob("*"):  # the state the default user's commands update
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o666)

    check = image.agent(host, "check", "--json")  # the image's default user, 65532
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout)
    assert report["verdict"] == "ok" and len(report["gpus"]) == 8 and report["runtimeName"] == "containerd", report
    labels = image.agent(host, "labels", "--no-output-file")
    assert labels.returncode == 0, labels.stderr
    assert "nvidia.com/gpu.count=8" in labels.stdout.splitlines(), labels.stdout
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in labels.stdout.splitlines(), labels.stdout


def test_the_image_holds_only_the_agent(image: Image, tmp_path: Path) -> None:
    probe = image.run(tmp_path, "python", "-c", """
import importlib.util as u, json, os, sys
names = ["pip", "setuptools", "wheel", "pulumi", "nvidia_gpu", "tests", "nvml_sim", "aiohttp", "grpc_tools",
         "kubernetes/client/models", "kubernetes/client/api", "kubernetes/aio"]
paths = [p for p in sys.path if p]  # by path: importing the client's package would load what is left out
found = {n: (u.find_spec(n) is not None) if "/" not in n else any(os.path.isdir(os.path.join(p, n)) for p in paths)
         for n in names}
print(json.dumps({"found": found, "uid": os.getuid(), "wheels": os.path.exists("/usr/share/python-wheels"),
                  "protos": sorted(f for d, _, fs in os.walk("/app") for f in fs if f.endswith("_pb2.py"))}))
""")
    assert probe.returncode == 0, probe.stderr
    facts = json.loads(probe.stdout)
    assert not any(facts["found"].values()), facts["found"]
    assert facts["uid"] == 65532 and facts["wheels"] is False, facts
    assert facts["protos"], "the gRPC stubs are generated in the build stage"
    simulated = image.agent(tmp_path, "check", simulator=False)  # without the simulated machines mounted
    assert simulated.returncode == 2 and "simulated machines are not available" in simulated.stderr, simulated.stderr
    config = json.loads(image.buildah("inspect", "--type", "image", image.tag).stdout)["OCIv1"]["config"]
    assert config["Entrypoint"] == ["python", "-m", "node_agent"] and config["User"] == "65532:65532", config
    size = _size_mb(image, image.tag)
    base = next(line.split()[-1] for line in image.build_log.splitlines() if line.startswith("image: building"))
    print(f"agent image {size:.0f} MB, base {_size_mb(image, base):.0f} MB (408 MB on python:3.11-slim before)")
    assert size < 204, f"the image is {size:.0f} MB: more than half the 408 MB it was"


def test_the_image_serves_the_eviction_guard(image: Image, tmp_path: Path) -> None:
    """The guard's certificate is made in the image (its cryptography wheel loads under the default user),
    and the command line is there; its serving is tested against the real API server elsewhere."""
    probe = image.run(tmp_path, "python", "-c", """
from node_agent.admission import certificates, server
from nvgpu import evictionguard
cert = certificates.generate(evictionguard.service_hosts("nvidia-gpu"))
server.tls_context(cert)
print("ok")
""")
    assert probe.returncode == 0 and probe.stdout.strip() == "ok", probe.stderr
    usage = image.run(tmp_path, "python", "-m", "node_agent", "eviction-guard", "--help")
    assert usage.returncode == 0 and "--extra-host" in usage.stdout, usage.stderr
