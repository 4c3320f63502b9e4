"""The shell blocks of the README and the documentation pages, run in order as a user would paste them
(``tests/kit/readme.py`` lists the pages, and says which lines are left out and how the environment differs).

The walk-through starts its own local control plane (``make cluster-up``) in the scratch checkout, deploys
the dev stack with the real Pulumi CLI, engine, provider and policy pack (in its own ``policies/venv``,
installed from PyPI as a user's is), destroys it and stops the control plane; the quick start and the
offline policy run need no cluster. A failing block is reported with its page, its line and its output.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.kit import readme
from tests.kit.tools import required_bin

pytestmark = pytest.mark.cluster

#: Seconds one block may take: the walk-through installs the policy pack's virtualenv from PyPI.
BLOCK_TIMEOUT_S = 900


def _scratch_checkout(dest: Path) -> None:
    """Tracked and untracked (not ignored) files of the checkout, timestamps kept, and ``.venv`` linked."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=readme.REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = readme.REPO / rel
        if not src.is_file():
            continue  # deleted in the working tree, not yet in the index
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    (dest / ".venv").symlink_to(readme.REPO / ".venv")


def _environment(home: Path, bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PULUMI_", "NVIDIA_GPU_")) and k not in ("KUBECONFIG", "VIRTUAL_ENV", "PYTHONPATH")}
    home.mkdir()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    # Pulumi finds its home from the password database, not $HOME: name the fresh one, so that nothing (logs,
    # workspaces, plugins) lands in the account's ~/.pulumi, which another clone's run shares.
    env.update(HOME=str(home), PULUMI_HOME=str(home / ".pulumi"), NVIDIA_GPU_TOOLS_CACHE=str(bin_dir.parent),
               PIP_CACHE_DIR=str(cache / "pip"))
    if shutil.which("go"):
        for var in ("GOCACHE", "GOMODCACHE", "GOPATH"):
            value = subprocess.run(["go", "env", var], capture_output=True, text=True, check=True).stdout.strip()
            if value:
                env[var] = value
    return env


def _venv_is_current(checkout: Path, env: dict[str, str]) -> bool:
    """``make venv`` would do nothing: otherwise it would reinstall the shared virtualenv from the scratch copy."""
    done = subprocess.run(["make", "-q", "venv"], check=False, cwd=checkout, env=env, capture_output=True)
    return done.returncode == 0


@pytest.mark.timeout(2400)
def test_the_readme_shell_blocks_run_as_written(tmp_path: Path) -> None:
    # kubectl too: the walk-through uses the one `make tools` builds, whatever the machine has.
    bin_dir = required_bin("pulumi", "pulumi-language-python", "pulumi-resource-kubernetes", "kube-apiserver",
                           "kubectl")
    checkout = tmp_path / "nvidia-gpu"
    _scratch_checkout(checkout)
    env = _environment(tmp_path / "home", bin_dir)
    assert _venv_is_current(checkout, env), "the .venv is older than the requirements: run `make venv` first"

    # Nothing may land in the account's own Pulumi state (`pulumi login --local` would put it there).
    account_stacks = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".pulumi" / "stacks" / "nvidia-gpu"
    stacks_before = sorted(account_stacks.glob("*")) if account_stacks.exists() else []
    timings: list[str] = []
    try:
        for block in readme.shell_blocks():
            run = readme.BLOCKS[block.name or ""]
            log = tmp_path / f"{block.name}.log"
            t0 = time.monotonic()
            with log.open("w") as out:
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", readme.script(block)], check=False,
                                      cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=BLOCK_TIMEOUT_S)
            timings.append(f"{block.name}: {time.monotonic() - t0:.0f} s")
            output = log.read_text(errors="replace")
            assert done.returncode == 0, (f"{block.where} (block {block.name!r}) exited "
                                          f"{done.returncode}; output:\n{output[-6000:]}")
            for path in run.leaves:
                assert (checkout / path).exists(), f"block {block.name!r} left no {path}:\n{output[-3000:]}"
            assert "Traceback" not in output, f"block {block.name!r} printed a traceback:\n{output[-6000:]}"
        assert (sorted(account_stacks.glob("*")) if account_stacks.exists() else []) == stacks_before
    finally:
        if (checkout / "out" / "cluster" / "state.json").exists():  # a walk-through cut short
            subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-m", "localcluster", "down"], check=False,
                           cwd=checkout, env=env, capture_output=True, timeout=120)
        print("documentation blocks:", ", ".join(timings))
