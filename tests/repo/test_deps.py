"""``make deps`` (``tools/deps.sh``): what ``make test`` needs from the machine, installed where it can be
and otherwise named in one line. Run here on a PATH of stand-ins, so no package is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPS = REPO / "tools" / "deps.sh"
COMMANDS = ("shellcheck", "openssl", "buildah", "debootstrap", "gcc", "unshare", "nsenter", "git", "iptables", "ip")
#: What a node needs besides commands, and where the script looks for it (``DEPS_INCLUDE_DIR``).
HEADERS = ("seccomp.h",)


def _bin(tmp_path: Path, *, have: tuple[str, ...], uid: int, go: str | None = "go1.26.8",
         apt: bool = False) -> Path:
    """A PATH holding bash's helpers, the commands in ``have``, an ``id`` answering ``uid`` and, when asked,
    a ``go`` reporting ``go`` and an ``apt-get`` that only records its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sed", "sort", "head", "tail", "date", "grep", "printf", "cat"):
        real = shutil.which(tool)
        if real:
            (bin_dir / tool).symlink_to(real)
    for name in have:
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if go is not None:
        (bin_dir / "go").write_text(f"#!/bin/sh\necho {go}\n")
    if apt:
        (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'apt.log'}\n")
    for f in bin_dir.iterdir():
        if not f.is_symlink():
            f.chmod(0o755)
    return bin_dir


def _run(bin_dir: Path, headers: tuple[str, ...] = HEADERS) -> subprocess.CompletedProcess[str]:
    include = bin_dir.parent / "include"
    include.mkdir(exist_ok=True)
    for name in headers:
        (include / name).write_text("")
    return subprocess.run([str(bin_dir / "bash"), str(DEPS)],
                          env={"PATH": str(bin_dir), "HOME": os.environ["HOME"], "DEPS_INCLUDE_DIR": str(include)},
                          capture_output=True, text=True, timeout=30, check=False)


def test_everything_present_costs_nothing(tmp_path: Path) -> None:
    done = _run(_bin(tmp_path, have=COMMANDS, uid=1000))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_missing_tools_without_root_are_named_in_one_line(tmp_path: Path) -> None:
    done = _run(_bin(tmp_path, have=("openssl", "gcc", "unshare", "nsenter", "git", "iptables", "ip"), uid=1000))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "deps: make test needs shellcheck buildah debootstrap: install them (Debian/Ubuntu: sudo apt-get install "
        "shellcheck buildah debootstrap), or run make test as root on Debian or Ubuntu, which installs them"]


def test_root_on_debian_installs_what_is_missing(tmp_path: Path) -> None:
    done = _run(_bin(tmp_path, have=("shellcheck", "openssl", "gcc", "unshare", "git"), uid=0, apt=True),
                headers=())
    assert done.returncode == 0, done.stderr
    # A real node's: nsenter (util-linux), iptables and ip (iproute2), and runc's seccomp header.
    assert (tmp_path / "apt.log").read_text().splitlines() == [
        "-o DPkg::Lock::Timeout=600 update -qq",
        "-o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends buildah debootstrap util-linux iptables "
        "iproute2 libseccomp-dev"]


@pytest.mark.parametrize(("go", "message"), [
    (None, "deps: make test needs Go 1.26.7 or newer to build the pinned components (make tools): install it "
           "from https://go.dev/dl and put it on PATH"),
    ("go1.24.2", "deps: Go 1.24.2 is older than the 1.26.7 the tools modules need (tools/*/go.mod): install a "
                 "newer one from https://go.dev/dl"),
])
def test_go_is_checked_never_installed(tmp_path: Path, go: str | None, message: str) -> None:
    want = max((line.split()[1] for p in (REPO / "tools").glob("*/go.mod") for line in p.read_text().splitlines()
                if line.startswith("go ")), key=lambda v: tuple(int(x) for x in v.split(".")))
    done = _run(_bin(tmp_path, have=COMMANDS, uid=0, go=go, apt=True))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [message.replace("1.26.7", want)]
    assert not (tmp_path / "apt.log").exists()
