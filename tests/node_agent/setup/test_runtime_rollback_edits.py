"""``runtime rollback`` / ``teardown`` undo what ``runtime apply`` changed and nothing else.

Teardown runs on every deletion of a setup pod, and operators edit ``/etc/containerd/config.toml`` in
between (a ``sandbox_image``, a registry mirror, an ``imports`` entry of their own). Rollback takes out our
drop-in and our ``imports`` entry and leaves every later edit as it is now; a value of ours that someone else
changed since is left as theirs, with a note. On containerd 1.x the drop-in carries a copy of config.toml's
CRI section (an import replaces a whole plugin section there), so a later edit of that section is reported
by ``check`` and taken into the copy by the next ``runtime apply``.
"""

from __future__ import annotations

import glob
import tomllib
from pathlib import Path
from typing import Any

import pytest

from node_agent.host import HostRoot
from node_agent.setup import runtime
from node_agent.setup.journal import Journal
from nvgpu.nodescripts import facts
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.node_agent.agent_testkit import Cli

NVML = "simulated:dgx-h100"
CONFIG = facts.CONTAINERD_CONFIG
PLAIN_DROPIN = f"{facts.CONTAINERD_IMPORT_DIR}/{facts.RUNTIME_DROPIN_NAME}"
OUR_IMPORT = f"{facts.CONTAINERD_IMPORT_DIR}/*.toml"
ROLLBACK = ("runtime", "rollback", "--no-restart")
TEARDOWN = ("teardown", "--no-patch-node", "--no-restart")


def _edit(containerd: int, text: str) -> str:
    """An operator's later edit of config.toml: an existing value changed and a registry table added."""
    if containerd == 1:
        assert 'sandbox_image = "registry.k8s.io/pause:3.9"' in text
        return (text.replace('pause:3.9"', 'pause:3.10"')
                + '    [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\n'
                  '      endpoint = ["https://mirror.example.com"]\n')
    assert 'snapshotter = "overlayfs"' in text
    return (text.replace('snapshotter = "overlayfs"', 'snapshotter = "native"')
            + "\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = \"/etc/containerd/certs.d\"\n")


def _plain(tmp_path: Path, containerd: int) -> FakeHost:
    return build_fake_host(tmp_path, "dgx-h100", containerd=containerd, deckhouse=False)  # type: ignore[arg-type]


def containerd1_sees(host: FakeHost) -> dict[str, Any]:
    """What containerd 1.x runs with: config.toml, then each import in order, a plugin's section in an import
    replacing that plugin's whole section (containerd 1.x ``services/server/config/config.go``, mergeConfig:
    "Replace entire sections instead of merging map's values"; containerd#5837)."""
    doc = tomllib.loads(host.path(CONFIG).read_text())
    plugins = dict(doc.get("plugins", {}))
    for pattern in doc.get("imports", []):
        for local in sorted(glob.glob(str(host.path(pattern)))):
            plugins.update(tomllib.loads(Path(local).read_text()).get("plugins", {}))
    return {**doc, "plugins": plugins}


@pytest.mark.parametrize("action", [ROLLBACK, TEARDOWN], ids=["rollback", "teardown"])
@pytest.mark.parametrize("containerd", [1, 2], ids=["containerd1", "containerd2"])
def test_rollback_keeps_an_operators_later_edit_to_config_toml(tmp_path: Path, cli: Cli, containerd: int,
                                                               action: tuple[str, ...]) -> None:
    """apply adds our imports line; the operator then changes a value and adds a mirror; rollback (or teardown)
    takes out our line only: config.toml is the operator's, byte for byte."""
    host = _plain(tmp_path, containerd)
    cfg = host.path(CONFIG)
    original = cfg.read_text()
    code, doc = cli(host.root, NVML, "runtime", "apply", "--no-restart")
    assert code == 0 and CONFIG in doc["changed"]
    edited = _edit(containerd, original)
    cfg.write_text(_edit(containerd, cfg.read_text()))
    code, doc = cli(host.root, NVML, *action)
    assert code == 0, doc
    assert cfg.read_text() == edited
    assert not host.path(PLAIN_DROPIN).exists() and not host.path(facts.CONTAINERD_IMPORT_DIR).exists()


def test_rollback_takes_only_our_entry_out_of_an_imports_line_the_operator_extended(tmp_path: Path, cli: Cli) -> None:
    host = _plain(tmp_path, 2)
    cfg = host.path(CONFIG)
    original = cfg.read_text()
    assert cli(host.root, NVML, "runtime", "apply", "--no-restart")[0] == 0
    line = f'imports = ["{OUR_IMPORT}"]'
    assert line in cfg.read_text()
    cfg.write_text(cfg.read_text().replace(line, f'imports = ["{OUR_IMPORT}", "/etc/containerd/mine/*.toml"]'))
    code, doc = cli(host.root, NVML, *ROLLBACK)
    assert code == 0, doc
    mine = 'imports = ["/etc/containerd/mine/*.toml"]\n'
    assert cfg.read_text() == original.replace("version = 3\n", f"version = 3\n{mine}")


@pytest.mark.parametrize("action", [ROLLBACK, TEARDOWN], ids=["rollback", "teardown"])
def test_rollback_keeps_our_imports_entry_while_an_operators_dropin_needs_it(tmp_path: Path, cli: Cli,
                                                                           action: tuple[str, ...]) -> None:
    """The operator put a drop-in of their own in conf.d after apply: taking our entry out would drop theirs.
    The note is in ``runtime rollback``'s output and in teardown's runtime step (the setup pod's log)."""
    host = _plain(tmp_path, 2)
    cfg = host.path(CONFIG)
    assert cli(host.root, NVML, "runtime", "apply", "--no-restart")[0] == 0
    applied = cfg.read_text()
    theirs = host.path("/etc/containerd/conf.d/10-mirrors.toml")
    theirs.write_text("[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = \"/etc/containerd/certs.d\"\n")
    code, doc = cli(host.root, NVML, *action)
    assert code == 0, doc
    assert cfg.read_text() == applied and theirs.exists() and not host.path(PLAIN_DROPIN).exists()
    notes = doc["notes"] if action == ROLLBACK else [s["detail"] for s in doc["steps"] if s["name"] == "runtime"]
    assert any("10-mirrors.toml" in n and OUR_IMPORT in n for n in notes), notes


def test_rollback_leaves_an_imports_line_the_operator_took_our_entry_out_of(tmp_path: Path, cli: Cli) -> None:
    """A value we set that someone else changed since is theirs: left as it is, and said so."""
    host = _plain(tmp_path, 1)
    cfg = host.path(CONFIG)
    assert cli(host.root, NVML, "runtime", "apply", "--no-restart")[0] == 0
    theirs = _edit(1, cfg.read_text()).replace(f'imports = ["{OUR_IMPORT}"]', 'imports = ["/etc/containerd/mine.toml"]')
    cfg.write_text(theirs)
    code, doc = cli(host.root, NVML, *ROLLBACK)
    assert code == 0, doc
    assert cfg.read_text() == theirs
    assert any(OUR_IMPORT in n and "left as it is" in n for n in doc["notes"]), doc["notes"]


@pytest.mark.parametrize(("containerd", "deckhouse"), [(1, True), (2, True), (1, False), (2, False)],
                         ids=["containerd1-deckhouse", "containerd2-deckhouse", "containerd1", "containerd2"])
def test_an_edited_dropin_is_reported_and_rollback_keeps_the_edit_aside(tmp_path: Path, cli: Cli, containerd: int,
                                                                        deckhouse: bool) -> None:
    """Our drop-in is ours: apply rewrites it and rollback removes it (it names the nvidia runtime, which teardown
    may remove too), but an edit someone made to it is never dropped silently: apply names the keys it puts
    back, rollback keeps the edited file under the agent's state dir and says where. A drop-in of the
    operator's own beside it is not touched."""
    host = build_fake_host(tmp_path, "dgx-h100", containerd=containerd, deckhouse=deckhouse)  # type: ignore[arg-type]
    dropin = (f"{facts.DECKHOUSE_DROPIN_DIRS[containerd + 1]}/{facts.RUNTIME_DROPIN_NAME}" if deckhouse
              else PLAIN_DROPIN)
    theirs = host.path(f"{dropin.rsplit('/', 1)[0]}/20-theirs.toml")
    assert cli(host.root, NVML, "runtime", "apply", "--no-restart")[0] == 0
    theirs.write_text('[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/opt/cni/bin"\n')
    ours = host.path(dropin)
    written = ours.read_text()
    ours.write_text(written.replace("SystemdCgroup = true", "SystemdCgroup = false"))
    code, doc = cli(host.root, NVML, "runtime", "apply", "--no-restart")
    assert code == 0 and dropin in doc["changed"] and ours.read_text() == written
    assert any(dropin in n and "SystemdCgroup" in n and "changed since nvidia-gpu wrote it" in n
               for n in doc["notes"]), doc["notes"]
    edited = written.replace("SystemdCgroup = true", "SystemdCgroup = false")
    ours.write_text(edited)
    code, doc = cli(host.root, NVML, *ROLLBACK)
    assert code == 0 and not ours.exists() and theirs.exists()
    kept = f"{facts.STATE_DIR}/edited{dropin}"
    assert host.path(kept).read_text() == edited
    assert any(dropin in n and kept in n for n in doc["notes"]), doc["notes"]


@pytest.mark.parametrize("containerd", [1, 2], ids=["containerd1", "containerd2"])
def test_apply_twice_rollback_twice_and_setup_teardown_cycles_keep_the_operators_edit(tmp_path: Path, cli: Cli,
                                                                                      containerd: int) -> None:
    """Setup on each start of the setup pod, teardown on each deletion: repeated, they never lose an edit."""
    host = _plain(tmp_path, containerd)
    cfg = host.path(CONFIG)
    original = cfg.read_text()
    assert cli(host.root, NVML, "runtime", "apply", "--no-restart")[0] == 0
    applied = host.snapshot("/etc")
    code, doc = cli(host.root, NVML, "runtime", "apply", "--no-restart")
    assert (code, doc["changed"]) == (0, []) and host.snapshot("/etc") == applied
    cfg.write_text(_edit(containerd, cfg.read_text()))
    edited = _edit(containerd, original)
    assert cli(host.root, NVML, *ROLLBACK)[0] == 0
    assert cfg.read_text() == edited
    after_one = host.snapshot("/etc")
    code, doc = cli(host.root, NVML, *ROLLBACK)
    assert (code, doc["changed"], doc["notes"]) == (0, [], []) and host.snapshot("/etc") == after_one
    for _ in range(2):
        code, doc = cli(host.root, NVML, "setup", "--no-patch-node", "--no-restart")
        assert code == 0 and doc["complete"], doc
        assert tomllib.loads(cfg.read_text())["imports"] == [OUR_IMPORT]
        assert cli(host.root, NVML, *TEARDOWN)[0] == 0
        assert cfg.read_text() == edited and host.snapshot("/etc") == after_one


def test_containerd1_copy_of_the_cri_section_follows_later_edits(tmp_path: Path, cli: Cli) -> None:
    """containerd 1.x replaces a whole plugin section from an import, so our drop-in carries config.toml's CRI
    section; a later edit there is frozen out until the copy is refreshed. ``check`` names the edited keys
    and says how to take them; ``runtime apply`` (setup, at each start of its pod) refreshes the copy, says
    so and restarts containerd; rollback leaves containerd with the edited config.toml."""
    host = _plain(tmp_path, 1)
    cfg = host.path(CONFIG)
    code, _ = cli(host.root, NVML, "runtime", "apply")
    assert code == 0
    cri = "io.containerd.grpc.v1.cri"
    assert containerd1_sees(host)["plugins"][cri]["sandbox_image"] == "registry.k8s.io/pause:3.9"
    cfg.write_text(_edit(1, cfg.read_text()))
    seen = containerd1_sees(host)["plugins"][cri]
    assert seen["sandbox_image"] == "registry.k8s.io/pause:3.9", "the copy shadows the edit until refreshed"
    code, doc = cli(host.root, NVML, "check", "--no-record")
    assert "sandbox_image" in doc["runtime"] and "registry.mirrors" in doc["runtime"], doc["runtime"]
    assert "runtime apply" in doc["runtime"] and PLAIN_DROPIN in doc["runtime"]
    code, doc = cli(host.root, NVML, "runtime", "apply")
    assert code == 0 and doc["changed"] == [PLAIN_DROPIN] and doc["restarted"], doc
    assert any("sandbox_image" in n and "refreshed" in n for n in doc["notes"]), doc["notes"]
    seen = containerd1_sees(host)["plugins"][cri]
    assert seen["sandbox_image"] == "registry.k8s.io/pause:3.10"
    assert seen["registry"]["mirrors"]["docker.io"]["endpoint"] == ["https://mirror.example.com"]
    assert seen["containerd"]["default_runtime_name"] == "nvidia" and seen["enable_cdi"] is True
    code, doc = cli(host.root, NVML, "check", "--no-record")
    assert "sandbox_image" not in doc["runtime"], doc["runtime"]
    assert cli(host.root, NVML, *ROLLBACK)[0] == 0
    seen = containerd1_sees(host)["plugins"][cri]
    assert seen["sandbox_image"] == "registry.k8s.io/pause:3.10"
    assert seen["containerd"]["default_runtime_name"] == "runc" and "nvidia" not in seen["containerd"]["runtimes"]


def test_a_journal_of_an_earlier_version_keeps_the_operators_edit(tmp_path: Path, cli: Cli) -> None:
    """Earlier versions journaled all of config.toml before adding the imports line; rollback of such a journal
    still takes out only our entry (the recorded original says the line was not there) and keeps the edit."""
    host = _plain(tmp_path, 2)
    root = HostRoot(host.root)
    cfg = host.path(CONFIG)
    original = cfg.read_text()
    journal = Journal(root, "runtime")
    config = runtime.load_config(root)
    new_text = runtime.with_import(config, OUR_IMPORT)
    assert new_text is not None
    journal.record(CONFIG)  # what the earlier apply journaled: the whole file
    cfg.write_text(new_text)
    journal.record(PLAIN_DROPIN)
    host.path(PLAIN_DROPIN).parent.mkdir(parents=True)
    host.path(PLAIN_DROPIN).write_text(runtime.render_dropin(root, config))
    cfg.write_text(_edit(2, cfg.read_text()))
    code, doc = cli(host.root, NVML, *ROLLBACK)
    assert code == 0, doc
    assert cfg.read_text() == _edit(2, original)
    assert not host.path(PLAIN_DROPIN).exists()


def test_rollback_refuses_a_config_toml_that_is_not_toml_and_changes_nothing(tmp_path: Path, cli: Cli) -> None:
    host = _plain(tmp_path, 2)
    assert cli(host.root, NVML, "runtime", "apply", "--no-restart")[0] == 0
    cfg = host.path(CONFIG)
    cfg.write_text(cfg.read_text() + "[plugins\nbroken = 1\n")
    before = host.snapshot("/etc")
    code, doc = cli(host.root, NVML, *ROLLBACK)
    assert code == 3 and CONFIG in doc["error"] and "not valid TOML" in doc["error"], doc
    assert "imports" in doc["error"]
    assert host.snapshot("/etc") == before


def test_a_config_whose_version_line_has_no_newline_gets_our_line_and_gives_it_back(tmp_path: Path, cli: Cli) -> None:
    """``version = 3`` and nothing else, not even a newline: apply adds its imports line on a line of its own (it
    crashed on TOML it had built itself before), rollback takes it out again."""
    host = _plain(tmp_path, 2)
    cfg = host.path(CONFIG)
    cfg.write_text("version = 3")
    code, doc = cli(host.root, NVML, "runtime", "apply", "--no-restart")
    assert code == 0, doc
    assert cfg.read_text() == f'version = 3\nimports = ["{OUR_IMPORT}"]\n'
    assert cli(host.root, NVML, *ROLLBACK)[0] == 0
    assert cfg.read_text() == "version = 3\n"
