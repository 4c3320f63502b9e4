"""Every GitHub workflow of the repository passes actionlint (with shellcheck over its ``run:`` scripts).

A workflow is only run by GitHub, after a merge; a typo in an expression, a `needs` to a job that does
not exist or a colon in an unquoted step name surfaces there, too late. actionlint (built from its Go
module with the other tools, ``make tools``) reads them as GitHub does.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.kit.tools import required_bin

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def _actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    actionlint = required_bin("actionlint") / "actionlint"
    # Without shellcheck actionlint skips the scripts silently: make that a failure instead.
    assert shutil.which("shellcheck"), "shellcheck is not installed (make deps installs it)"
    return subprocess.run([str(actionlint), "-no-color", *map(str, paths)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


def test_every_workflow_passes_actionlint() -> None:
    assert WORKFLOWS
    done = _actionlint(*WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_what_github_would_refuse(tmp_path: Path) -> None:
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    needs: missing\n"
                   "    steps:\n      - run: echo ${{ github.nope }}\n")
    done = _actionlint(bad)
    assert done.returncode == 1
    assert 'job "a" needs job "missing" which does not exist' in done.stdout, done.stdout
    assert 'property "nope" is not defined' in done.stdout, done.stdout
