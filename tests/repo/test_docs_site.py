"""The documentation: the MkDocs site builds in strict mode (a broken link or anchor, or a page missing from
the nav, fails it), the README stays a short front page, and what its tour shows is what the code prints.

The site is built into a temporary directory, never into the repository. ``tests/repo/test_readme.py`` and
``tests/cluster/test_readme.py`` cover the pages' shell blocks; the pages' other checked content lives with
the code it describes (``tests/nvgpu/test_capacity.py``, ``tests/nvidia_gpu/components/test_alerts.py``,
``tests/repo/test_migration_guide.py``, ``tests/repo/test_security_doc.py``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nvgpu import catalogue
from nvidia_gpu.preview.pipeline import run_preview
from nvidia_gpu.preview.summary import summary_lines

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: Two screens: what the README may grow to before its content belongs in docs/.
README_MAX_LINES = 100
#: Files at the top of the repository that link into it.
FRONT_PAGES = ("README.md", "CONTRIBUTING.md", "SECURITY.md", "CHANGELOG.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, printed on every build
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "index.html").is_file()
    assert (site / "operations" / "runbooks" / "index.html").is_file()


def test_strict_mode_fails_on_every_kind_of_broken_reference() -> None:
    """Strict mode fails on warnings only: every validation mkdocs.yml can make a warning is one."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["validation"] == {"omitted_files": "warn", "not_found": "warn", "absolute_links": "warn",
                                    "unrecognized_links": "warn", "anchors": "warn"}
    assert config["docs_dir"] == "docs"


def test_the_readme_fits_two_screens() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move the detail into docs/"


@pytest.mark.parametrize("page", FRONT_PAGES)
def test_the_front_pages_link_only_to_files_that_exist(page: str) -> None:
    path = REPO / page
    links = [m for m in LINK.findall(path.read_text()) if not m.startswith(("http://", "https://", "mailto:", "#"))]
    missing = [link for link in links if not (path.parent / link.split("#", 1)[0]).exists()]
    assert not missing, f"{page} links to files that do not exist: {missing}"


def _text_block(text: str, first_line: str) -> list[str]:
    """The lines of the fenced ``text`` block of the README that starts with ``first_line``."""
    start = text.index(f"```text\n{first_line}") + len("```text\n")
    return text[start:text.index("\n```", start)].splitlines()


def _assert_shown_in_order(shown: list[str], printed: list[str]) -> None:
    """Each run of shown lines between ``...`` lines is a run of printed lines, in order."""
    chunks: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == "...":
            chunks.append([])
        else:
            chunks[-1].append(line)
    at = 0
    for chunk in filter(None, chunks):
        found = next((i for i in range(at, len(printed) - len(chunk) + 1) if printed[i:i + len(chunk)] == chunk),
                     None)
        assert found is not None, "not printed (in this order):\n" + "\n".join(chunk)
        at = found + len(chunk)


def test_the_readme_tour_shows_what_the_preview_and_the_pack_print(tmp_path: Path) -> None:
    text = README.read_text()
    result = run_preview(REPO, "dev", out_dir=tmp_path)
    assert result.ok, result.problems
    _assert_shown_in_order(_text_block(text, "Previewing update (dev)"), summary_lines(result))

    shown = _text_block(text, "$ echo")
    echo = re.fullmatch(r"\$ echo '(.*)' > (\S+)", shown[0])
    assert echo is not None, shown[0]
    config = tmp_path / echo.group(2)
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(json.loads(echo.group(1))))
    assert shown[1] == ("$ .venv/bin/python -m nvidia_gpu.preview.policyrun.offline --plan out/dev/plan.json "
                        f"--policy-pack-config {echo.group(2)}")
    argv = ["--plan", str(tmp_path / "plan.json"), "--policy-pack-config", str(config),
            "--stack-file", str(REPO / "Pulumi.dev.yaml")]
    done = subprocess.run([sys.executable, "-m", "nvidia_gpu.preview.policyrun.offline", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr  # mandatory violations, as the tour says
    _assert_shown_in_order(shown[2:], done.stdout.splitlines())


def test_the_stack_config_page_names_every_catalogue_model() -> None:
    """docs/concepts/stack-config.md lists the models ``gpu.model`` takes; a model added to the catalogue is
    added there (CONTRIBUTING.md, "Adding a GPU model")."""
    section = (REPO / "docs" / "concepts" / "stack-config.md").read_text().split("## The GPU catalogue", 1)[1]
    listed = re.findall(r"`([A-Za-z0-9.-]+)`", section.split("The catalogue (`nvgpu/catalogue.py`)", 1)[0])
    assert sorted(listed) == sorted(catalogue.MODEL_KEYS)
