"""Every shell block in the README and the documentation pages is named and known to the test that runs it
(``tests/cluster/test_readme.py``).

A block nobody runs is how documentation drifts from the code; this fails as soon as one is added without a
name, named twice, given a name the runner does not know, or put on a page the runner does not read, and when
a runner's name has no block.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from tests.kit import readme


def test_every_shell_block_is_named_once_and_known_to_the_runner() -> None:
    shell = readme.shell_blocks()
    unnamed = [b.where for b in shell if b.name is None]
    assert not unnamed, (f"shell blocks at {unnamed} have no `<!-- readme-test: NAME -->` line before "
                         f"their fence: name them and say in tests/kit/readme.py how they run")
    names = [b.name for b in shell if b.name is not None]
    assert len(names) == len(set(names)), f"a block name is used twice: {names}"
    unknown = sorted(set(names) - set(readme.BLOCKS))
    assert not unknown, f"blocks {unknown} are not in tests/kit/readme.BLOCKS"
    orphans = sorted(set(readme.BLOCKS) - set(names))
    assert not orphans, f"tests/kit/readme.BLOCKS names {orphans}, which no page in readme.PAGES has"
    assert names == [n for n in readme.BLOCKS if n in names], "BLOCKS lists the blocks in the order the pages run"


def test_the_setup_commands_stay_at_the_top_of_the_readme() -> None:
    """The two commands a newcomer runs first: the README's first block, before any prose."""
    first = readme.blocks(readme.README)[0]
    assert (first.name, first.page, first.line) == ("setup", "README.md", 5)
    commands = [line.split("#", 1)[0].strip() for line in first.text.splitlines()]
    assert commands == ["make preview STACK=dev", "make test"]


def test_no_page_outside_the_runner_has_a_shell_block() -> None:
    """A fenced shell block on a page the runner does not read would never run: list the page in
    readme.PAGES, or show the command as an indented block (for reading, not running)."""
    run = {readme.REPO / page for page in readme.PAGES}
    stray = [b.where for page in readme.markdown_pages() if page not in run
             for b in readme.shell_blocks(page)]
    assert not stray, f"shell blocks on pages tests/kit/readme.PAGES does not list: {stray}"
    assert all((readme.REPO / page).is_file() for page in readme.PAGES), readme.PAGES


def test_a_marker_names_only_a_fenced_block(tmp_path: Path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text("# x\n\n<!-- readme-test: setup -->\n```sh\nmake preview\nmake test\n```\n\n```sh\necho hi\n```\n"
                   "```text\nnot a command\n```\n")
    found = readme.blocks(doc)
    assert [(b.lang, b.name, b.line) for b in found] == [("sh", "setup", 5), ("sh", None, 10), ("text", None, 13)]
    assert [b.name for b in readme.shell_blocks(doc)] == ["setup", None]


def test_skipped_lines_are_whole_commands_only() -> None:
    block = readme.Block("sh", "make preview STACK=dev   # render\nmake test                # all\n"
                               "make test-extra\n", 3, "setup")
    assert readme.script(block) == "make preview STACK=dev   # render\nmake test-extra\n"
    login = readme.Block("sh", "pulumi login --local   # or s3://\npulumi stack init dev\n", 3, "pulumi-walkthrough")
    assert readme.script(login) == 'pulumi login "file://$HOME"\npulumi stack init dev\n'


@pytest.mark.parametrize("name", sorted(readme.BLOCKS))
def test_every_skipped_line_is_in_its_block(name: str) -> None:
    """A skip for a line the block no longer has would hide nothing, and means the page changed."""
    block = next(b for b in readme.shell_blocks() if b.name == name)
    commands = {line.split("#", 1)[0].strip() for line in block.text.splitlines()}
    run = readme.BLOCKS[name]
    missing = [s for s in (*run.skip_lines, *(old for old, _ in run.replace_lines)) if s not in commands]
    assert not missing, f"{name}: skip_lines or replace_lines {missing} are not lines of the block"


def test_the_offline_provider_install_names_the_pinned_provider() -> None:
    """The offline install of the Kubernetes provider (docs/guides/library.md) names the version the package
    declares."""
    (block,) = [b for b in readme.shell_blocks() if b.name == "provider-offline"]
    assert f"plugin install resource kubernetes {version('pulumi-kubernetes')} --file" in block.text
