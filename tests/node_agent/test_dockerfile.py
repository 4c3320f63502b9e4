"""The agent image recipe: pinned base via build arg, agent dependencies only, stubs built, non-root."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "node_agent" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_base_image_is_a_pinned_build_arg() -> None:
    ins = _instructions()
    assert ins[0][0] == "ARG" and ins[0][1].startswith("BASE_IMAGE=")
    default = ins[0][1].split("=", 1)[1]
    assert re.search(r":\d+\.\d+\.\d+-", default), "the default base must pin an exact Python version"
    assert [rest for word, rest in ins if word == "FROM"] == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]


def test_only_agent_dependencies_and_no_pulumi() -> None:
    text = DOCKERFILE.read_text()
    runs = " ".join(rest for word, rest in _instructions() if word == "RUN")
    assert "pip install --no-compile -r requirements-agent.txt" in runs
    # Bytecode by source hash, once, for everything the image runs: reproducible, and never stale in the image.
    assert "compileall -q --invalidation-mode checked-hash nvgpu node_agent /opt/agent/lib" in runs
    assert "pulumi" not in runs.lower()
    agent_reqs = [ln for ln in (REPO / "requirements-agent.txt").read_text().lower().splitlines()
                  if ln.strip() and not ln.startswith("#")]
    assert agent_reqs and not any("pulumi" in ln or ln.startswith("-r") for ln in agent_reqs)
    copies = [rest.split()[-2] if not rest.startswith("--from") else "" for word, rest in _instructions()
              if word == "COPY"]
    assert not any(c.startswith(("nvidia_gpu", "policies", "__main__")) for c in copies)
    assert "grpcio-tools" in text and "grpc_tools.protoc" in text


def test_copied_sources_exist() -> None:
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                assert (REPO / src).exists(), src


def test_runs_as_non_root_by_default() -> None:
    users = [rest for word, rest in _instructions() if word == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    entry = [rest for word, rest in _instructions() if word == "ENTRYPOINT"]
    assert entry == ['["python", "-m", "node_agent"]']


def test_build_stage_pins_match_requirements() -> None:
    reqs = (REPO / "requirements.txt").read_text()
    assert re.search(r"^grpcio-tools==\d", reqs, re.MULTILINE)
    assert re.search(r"^protobuf==\d", reqs, re.MULTILINE)


def test_no_registry_fetch_for_the_build_frontend() -> None:
    """A ``# syntax=`` line makes BuildKit pull a frontend image first: offline and air-gapped builds fail."""
    assert not any(line.lower().startswith("# syntax") for line in DOCKERFILE.read_text().splitlines())


def test_a_private_index_and_its_ca_can_be_given() -> None:
    args = [rest for word, rest in _instructions() if word == "ARG"]
    assert any(a.startswith("PIP_INDEX_URL=") for a in args)
    env = " ".join(rest for word, rest in _instructions() if word == "ENV")
    assert "PIP_INDEX_URL=${PIP_INDEX_URL}" in env and "PIP_CERT=/etc/ssl/certs/ca-certificates.crt" in env
    ca = [rest for word, rest in _instructions() if word == "COPY" and rest.startswith("node_agent/image/ca/")]
    assert ca and (REPO / "node_agent" / "image" / "ca").is_dir()
    assert "update-ca-certificates" in " ".join(rest for word, rest in _instructions() if word == "RUN")


def test_the_final_stage_has_no_installer_and_no_unused_client() -> None:
    ins = _instructions()
    final = ins[[i for i, (word, _) in enumerate(ins) if word == "FROM"][-1]:]
    runs = " ".join(rest for word, rest in ins if word == "RUN")
    uninstalled = runs.split("pip uninstall -q -y", 1)[1].split("&&", 1)[0].split()  # from the agent's venv
    assert {"pip", "setuptools", "aiohttp", "multidict", "yarl"} <= set(uninstalled), uninstalled
    for unused in ("kubernetes/aio", "kubernetes/client/api", "kubernetes/client/models"):  # never imported
        assert f"site-packages/{unused}" in runs, unused
    final_runs = " ".join(rest for word, rest in final if word == "RUN")
    assert "site-packages/pip" in final_runs and "/usr/local/bin/pip" in final_runs  # python:*-slim's own
    assert "/usr/share/python-wheels" in final_runs  # a Debian base's, for ensurepip
    assert "rm -rf node_agent/Dockerfile node_agent/image" in runs  # build inputs, not agent code


def test_the_build_context_is_only_what_the_image_copies() -> None:
    """Without a .dockerignore, ``docker build .`` sends .venv and policies/venv (over 600 MB) to the daemon."""
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = {src.rstrip("/").split("/")[0] for word, rest in _instructions()
              if word == "COPY" and not rest.startswith("--from") for src in rest.split()[:-1]}
    assert copied <= allowed, copied - allowed
    assert not allowed & {".venv", "tests", "policies", "nvidia_gpu", ".git"}
