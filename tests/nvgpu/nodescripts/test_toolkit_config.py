"""The NVIDIA toolkit's config after node setup, by the agent and by ``gpu-runtime.sh``: our block on top,
the package's lines that set the same keys disabled, byte-identical from both paths, undone exactly.

The toolkit's package installs the file with ``accept-nvidia-visible-devices-envvar-when-unprivileged``
at its default (true): any pod that sets ``NVIDIA_VISIBLE_DEVICES=all`` would get every GPU of the node.
What NVIDIA's own hook makes of the result is ``tests/compare/test_toolkit_device_selection.py``.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from node_agent.cli import main
from node_agent.setup.executor import block_edited, block_restored
from nvgpu.nodescripts import facts, render_node_scripts
from nvgpu.nodescripts.plan import toolkit_config
from nvml_sim.host import TOOLKIT_PACKAGE_CONFIG
from tests.kit.fakecrio import build_crio_host
from tests.kit.fakehost import FakeHost, build_fake_host

TOOLKIT = facts.TOOLKIT_CONFIG
ENVVAR, MOUNTS = facts.TOOLKIT_ENVVAR_KEY, facts.TOOLKIT_VOLUME_MOUNTS_KEY
#: A config an admin edited: the envvar key set explicitly in the root table, once more in a table (not ours).
ADMIN_CONFIG = (f"{ENVVAR} = true\n{MOUNTS}=false\ndisable-require = false\n\n"
                f'[nvidia-container-cli]\n{ENVVAR} = "not a root key"\nload-kmods = true\n')


def _agent(host: FakeHost, *args: str) -> int:
    return main(["--host-root", str(host.root), "--host-exec", "direct", "--nvml", host.nvml_spec, "--json", *args])


def _script(host: FakeHost, tmp: Path, *, accept_envvar: bool) -> subprocess.CompletedProcess[str]:
    scripts = {s.name: s for s in render_node_scripts(accept_envvar=accept_envvar)}
    path = tmp / f"gpu-runtime-{accept_envvar}.sh"
    path.write_text(scripts["gpu-runtime.sh"].content)
    return subprocess.run(["bash", str(path)], env=host.env(), capture_output=True, text=True, timeout=120,
                          check=False)


def _toolkit(host: FakeHost) -> dict[str, object]:
    return tomllib.loads(host.path(TOOLKIT).read_text())


def test_package_config_gets_the_safe_block_and_keeps_everything_else(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    before = host.path(TOOLKIT).read_text()
    assert before == TOOLKIT_PACKAGE_CONFIG
    assert _agent(host, "runtime", "apply", "--no-restart") == 0
    text = host.path(TOOLKIT).read_text()
    assert text.endswith(before)  # the package's file, untouched below our block
    assert text.startswith(f"{facts.TOOLKIT_BLOCK_BEGIN}\n{ENVVAR} = false\n{MOUNTS} = true\n"
                           f"{facts.TOOLKIT_BLOCK_END}\n")
    doc = _toolkit(host)
    assert (doc[ENVVAR], doc[MOUNTS]) == (False, True)
    assert {k: v for k, v in doc.items() if k not in (ENVVAR, MOUNTS)} == tomllib.loads(before)


def test_explicit_root_keys_are_disabled_and_come_back_on_rollback(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "l4x2", containerd=2)
    host.path(TOOLKIT).write_text(ADMIN_CONFIG)
    before = host.snapshot("/etc")
    assert _agent(host, "runtime", "apply", "--no-restart") == 0
    text = host.path(TOOLKIT).read_text()
    assert f"{facts.TOOLKIT_DISABLED_PREFIX}{ENVVAR} = true\n" in text
    assert f"{facts.TOOLKIT_DISABLED_PREFIX}{MOUNTS}=false\n" in text
    assert f'{ENVVAR} = "not a root key"' in text and _toolkit(host)["nvidia-container-cli"] == {
        ENVVAR: "not a root key", "load-kmods": True}
    assert (_toolkit(host)[ENVVAR], _toolkit(host)[MOUNTS]) == (False, True)
    assert _agent(host, "runtime", "rollback", "--no-restart") == 0
    assert host.snapshot("/etc") == before


def test_envvar_choice_flips_only_the_toolkit_config_without_a_restart(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    assert _agent(host, "runtime", "apply") == 0
    assert host.log("systemctl") == ["restart containerd"]
    capsys.readouterr()
    assert _agent(host, "runtime", "apply", "--accept-envvar-when-unprivileged") == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["changed"], doc["restarted"], doc["toolkitAcceptsEnvvarWhenUnprivileged"]) == ([TOOLKIT], False, True)
    assert _toolkit(host)[ENVVAR] is True and host.log("systemctl") == ["restart containerd"]
    assert _agent(host, "runtime", "apply") == 0
    assert _toolkit(host)[ENVVAR] is False


def test_a_missing_config_is_created_and_removed_again(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "l4x2", toolkit_config=False)
    before = host.snapshot("/etc")
    assert _agent(host, "runtime", "apply", "--no-restart") == 0
    assert _toolkit(host) == {ENVVAR: False, MOUNTS: True}  # the toolkit fills in its defaults for the rest
    assert _agent(host, "runtime", "rollback", "--no-restart") == 0
    assert host.snapshot("/etc") == before and not host.path(TOOLKIT).exists()


def test_without_the_nvidia_runtime_the_toolkit_config_is_left_alone(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    host = build_fake_host(tmp_path, "l4x2", nvidia_container_runtime=False)
    host.path(TOOLKIT).parent.mkdir(parents=True, exist_ok=True)
    host.path(TOOLKIT).write_text(ADMIN_CONFIG)
    capsys.readouterr()
    assert _agent(host, "runtime", "apply", "--no-restart") == 0
    doc = json.loads(capsys.readouterr().out)
    assert host.path(TOOLKIT).read_text() == ADMIN_CONFIG and TOOLKIT not in doc["changed"]
    assert any(f"{TOOLKIT} left alone" in n for n in doc["notes"])


@pytest.mark.parametrize(("text", "says"), [
    ("[nvidia-container-cli\nload-kmods = true\n", "is not valid TOML"),
    (f'"{ENVVAR}" = true\n', "with our block added is not valid TOML"),  # a quoted key: a duplicate for TOML
])
def test_a_config_we_cannot_edit_safely_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str) -> None:
    host = build_fake_host(tmp_path, "l4x2")
    host.path(TOOLKIT).write_text(text)
    before = host.snapshot("/")
    capsys.readouterr()
    assert _agent(host, "runtime", "apply") != 0
    err = json.loads(capsys.readouterr().out)
    assert TOOLKIT in err["error"] and says in err["error"] and "nothing written" in err["error"]
    assert host.snapshot("/") == before and host.log("systemctl") == []


@pytest.mark.parametrize("accept_envvar", [False, True])
@pytest.mark.parametrize("layout", ["package", "admin", "absent", "crio"])
def test_script_and_agent_write_the_same_bytes(tmp_path: Path, layout: str, accept_envvar: bool) -> None:
    def build(root: Path) -> FakeHost:
        if layout == "crio":
            return build_crio_host(root, "l4x2")
        host = build_fake_host(root, "l4x2", toolkit_config=layout != "absent")
        if layout == "admin":
            host.path(TOOLKIT).write_text(ADMIN_CONFIG)
        return host

    by_script, by_agent = build(tmp_path / "script"), build(tmp_path / "agent")
    before = by_script.snapshot("/etc")
    run = _script(by_script, tmp_path, accept_envvar=accept_envvar)
    assert run.returncode == 0, run.stderr
    flag = ["--accept-envvar-when-unprivileged"] if accept_envvar else []
    assert _agent(by_agent, "runtime", "apply", "--no-restart", *flag) == 0
    assert by_script.path(TOOLKIT).read_text() == by_agent.path(TOOLKIT).read_text()
    assert _toolkit(by_script)[ENVVAR] is accept_envvar
    assert by_script.snapshot("/etc") == by_agent.snapshot("/etc")
    # The script runs at every bashible pass: a second run changes nothing.
    again = _script(by_script, tmp_path, accept_envvar=accept_envvar)
    assert f"{TOOLKIT} unchanged" in again.stderr
    # Nodes set up by the script are torn down by the agent.
    assert _agent(by_script, "teardown", "--no-patch-node", "--no-restart") == 0
    assert by_script.snapshot("/etc") == before


def test_edit_and_restore_are_exact_inverses() -> None:
    for text in (TOOLKIT_PACKAGE_CONFIG, ADMIN_CONFIG, "", "# only a comment\n"):
        for accept in (False, True):
            block, other = toolkit_config(accept), toolkit_config(not accept)
            edited = block_edited(block, text, {})
            assert block_restored(block, edited) == text
            assert block_edited(block, edited, {}) == edited  # idempotent
            assert block_edited(block, block_edited(other, text, {}), {}) == edited
