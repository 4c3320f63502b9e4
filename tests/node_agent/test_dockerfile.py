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
    assert "pip install -r requirements-agent.txt" in runs
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
