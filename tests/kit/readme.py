"""The shell blocks of the README and the documentation pages, as the tests that run them see them.

Every fenced ``sh`` block in README.md and in ``docs/`` is a command a user will paste, so each one is run by
``tests/cluster/test_readme.py``, page by page in :data:`PAGES` order and within a page in order, exactly as
written except for the substitutions listed here. A block is named by the HTML comment on the line before its
fence (``<!-- readme-test: NAME -->``, invisible on GitHub and on the site); ``tests/repo/test_readme.py``
fails on a shell block without a name, a name used twice, a name this module does not know, or a shell block
on a page :data:`PAGES` does not list, so a new block cannot slip in untested. A command shown for reading
only is an indented block, which is not a fenced block.

Substitutions, for every block (the environment, not the commands):

* the blocks run one after the other, each in a fresh ``bash -euo pipefail``, in a scratch copy of the
  checkout (its tracked and untracked files, timestamps kept) whose ``.venv`` links to the virtualenv
  running the tests, so ``make venv`` finds it up to date instead of installing again;
* ``HOME`` is a fresh directory (Pulumi's ``~/.pulumi`` and local backend, kubeconfigs), while the tools,
  Go and pip caches point at the real ones, so ``make tools`` finds its build and nothing is compiled;
* the caller's ``PULUMI_*`` and ``KUBECONFIG`` variables are removed.

Per block, :data:`BLOCKS` says which lines are left out or replaced, and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"

#: The pages whose shell blocks are run, in the order they run (relative to the repository): the README's
#: set-up first (it renders out/dev, which the offline policy run reads), the walk-through's `make cluster-down`
#: before the control-plane page's own `make cluster-up`.
PAGES: tuple[str, ...] = (
    "README.md",
    "docs/concepts/node-agent.md",
    "docs/getting-started/deckhouse.md",
    "docs/guides/library.md",
    "docs/contributing/control-plane.md",
    "docs/guides/policy-pack.md",
)

#: The languages of blocks that are commands to run.
SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})
MARKER = re.compile(r"^<!--\s*readme-test:\s*([a-z0-9-]+)\s*-->\s*$")
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its text, the page's line of its first command, its name, its page
    (relative to the repository)."""

    lang: str
    text: str
    line: int
    name: str | None
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


@dataclass(frozen=True)
class Run:
    """How a named block is run: lines left out or replaced (whole lines, matched exactly after
    stripping a trailing comment), and the reason."""

    skip_lines: tuple[str, ...] = ()
    #: (command, what runs instead)
    replace_lines: tuple[tuple[str, str], ...] = ()
    why: str = ""
    #: Files the block must leave behind, relative to the scratch checkout (what a user would look at).
    leaves: tuple[str, ...] = field(default=())


#: Every named block, in the order the pages run (:data:`PAGES`), and within a page in its order.
BLOCKS: dict[str, Run] = {
    "setup": Run(skip_lines=("make test",),
                 why="`make test` is the command running this test; `make preview` runs as written",
                 leaves=("out/dev/plan.json", "out/dev/manifests")),
    "agent-quickstart": Run(),
    "pulumi-walkthrough": Run(
        replace_lines=(("pulumi login --local", 'pulumi login "file://$HOME"'),),
        why="`--local` is `file://~`, the account's home from the password database, not $HOME: the test's "
            "stacks go to its fresh HOME instead of the machine's ~/.pulumi"),
    "provider-offline": Run(),
    "cluster-up": Run(),
    "real-node": Run(),
    "policies-offline": Run(),
}


def _page(path: Path) -> str:
    return path.resolve().relative_to(REPO).as_posix() if path.resolve().is_relative_to(REPO) else path.name


def blocks(path: Path = README) -> list[Block]:
    """Every fenced block of ``path``, in order, with the name its marker line gives it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = _page(path)
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        out.append(Block(m.group(1).lower(), "\n".join(body) + "\n", start + 2,
                         marker.group(1) if marker else None, page))
        i += 1
    return out


def shell_blocks(path: Path | None = None) -> list[Block]:
    """The shell blocks of ``path``, or of every page in :data:`PAGES`, in the order they run."""
    paths = [path] if path is not None else [REPO / page for page in PAGES]
    return [b for p in paths for b in blocks(p) if b.lang in SHELL_LANGS]


def markdown_pages() -> list[Path]:
    """Every Markdown page a reader may copy a command from: the repository's top-level ``*.md`` and ``docs/``."""
    return sorted([*REPO.glob("*.md"), *DOCS.rglob("*.md")])


def script(block: Block) -> str:
    """The block as it is run: the lines its :class:`Run` leaves out removed, nothing else changed."""
    run = BLOCKS[block.name or ""]
    replace = dict(run.replace_lines)
    kept = []
    for line in block.text.splitlines():
        command = line.split("#", 1)[0].strip()
        if command not in run.skip_lines:
            kept.append(replace.get(command, line))
    return "\n".join(kept) + "\n"
