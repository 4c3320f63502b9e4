"""Run a CrossGuard Python pack over gRPC exactly as ``pulumi preview --policy-pack`` does, without the CLI.

The CLI's legacy shim for Python packs starts ``<python> -u -m pulumi.policy <engineAddr> .`` in the pack
directory (with the pack's ``virtualenv`` when PulumiPolicy.yaml names one), passes the stack config in
``PULUMI_CONFIG`` plus ``PULUMI_PROJECT``/``PULUMI_STACK``/``PULUMI_DRY_RUN``, reads the port the pack
prints on its first stdout line, and then calls ``Handshake`` (tolerating UNIMPLEMENTED),
``ConfigureStack``, ``GetAnalyzerInfo``, ``Configure`` (only when policy
config is given, with every policy's enforcement level resolved the way the CLI resolves
``--policy-pack-config``), ``Analyze`` once per resource and ``AnalyzeStack`` once with all of them.
:class:`PackProcess` does the same, so the offline preview and the tests exercise the real pack
process and the real servicer, not a re-implementation. The protocol's messages and stub are the SDK's
generated code, which :mod:`nvidia_gpu.sdk.analyzer` wraps: this module sees plain values.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import grpc
import jsonschema
import yaml

from nvgpu.stackconfig import CONFIG_FILE_ENV
from nvidia_gpu import sdk
from nvidia_gpu.sdk import analyzer
from nvidia_gpu.sdk.analyzer import AnalyzerStub, PackInfo, PolicyConfig, ReportedDiagnostic, policy_config

log = logging.getLogger(__name__)

#: The repository's pack directory (``policies/``: PulumiPolicy.yaml and its thin ``__main__.py``, the one
#: ``pulumi preview --policy-pack policies`` runs). It is not a Python package, so it is found from this
#: checkout (``nvidia_gpu/preview/policyrun/`` -> the root), as an editable install sees it.
PACK_DIR = Path(__file__).resolve().parents[3] / "policies"
#: The CLI passes its own engine address; a Python pack never dials it, so any address will do offline.
OFFLINE_ENGINE_ADDRESS = "127.0.0.1:0"
#: Seconds ``AnalyzeStack``'s deadline grows per resource analyzed (five times the 2 ms a resource costs).
STACK_SECONDS_PER_RESOURCE = 0.01
#: The type of the stack's root resource, the parent of every top-level resource (and the first one the
#: engine sends ``AnalyzeStack``).
ROOT_STACK_TYPE = sdk.ROOT_STACK_TYPE
LEVELS = analyzer.LEVELS


class PackError(RuntimeError):
    """The pack did not start, or broke the protocol; the message carries the pack's stderr."""


class PolicyConfigError(ValueError):
    """``--policy-pack-config`` content the CLI would refuse; ``problems`` names each key."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid policy pack config:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True)
class AnalyzerResource:
    """One resource as the engine describes it to an analyzer (type token, URN, name, inputs)."""

    type: str
    urn: str
    name: str
    props: Mapping[str, Any]
    parent: str = ""
    dependencies: tuple[str, ...] = ()


@dataclass(frozen=True)
class Diagnostic:
    """One reported violation (or advisory "can't run during preview" note)."""

    policy_name: str
    pack_name: str
    pack_version: str
    description: str
    message: str
    enforcement_level: str
    urn: str
    resource_type: str = ""
    resource_name: str = ""

    @property
    def mandatory(self) -> bool:
        return self.enforcement_level in ("mandatory", "remediate")


@dataclass(frozen=True)
class StackContext:
    """What the CLI knows about the stack and hands the pack through its environment."""

    project: str
    stack: str
    config: Mapping[str, Any] = field(default_factory=dict)  #: full keys, e.g. ``nvidia-gpu:cluster``
    dry_run: bool = True
    organization: str = "organization"

    def flat_config(self) -> dict[str, str]:
        """The config as the CLI sends it: a JSON object of strings, structured values as JSON text."""
        return {k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for k, v in self.config.items()}

    def environment(self, config_file: Path | None = None) -> dict[str, str]:
        """The CLI's variables. The config goes in ``PULUMI_CONFIG`` as the CLI sends it, or, with
        ``config_file``, written to that file and named in ``CONFIG_FILE_ENV``: one environment string may
        not pass 128 KiB on Linux, which a stack of about 800 node groups does."""
        flat = self.flat_config()
        env = {
            "PULUMI_PROJECT": self.project,
            "PULUMI_STACK": self.stack,
            "PULUMI_DRY_RUN": "true" if self.dry_run else "false",
            "PULUMI_ORGANIZATION": self.organization,
        }
        if flat and config_file is not None:
            config_file.write_text(json.dumps(flat, separators=(",", ":")), encoding="utf-8")
            env[CONFIG_FILE_ENV] = str(config_file)
        elif flat:
            env["PULUMI_CONFIG"] = json.dumps(flat, separators=(",", ":"))
        return env


@dataclass(frozen=True)
class PackManifest:
    """The parts of ``PulumiPolicy.yaml`` the CLI reads: the version and the runtime's virtualenv."""

    version: str
    virtualenv: str | None

    @classmethod
    def load(cls, pack_dir: Path) -> PackManifest:
        path = pack_dir / "PulumiPolicy.yaml"
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise PackError(f"failed to load Pulumi policy project located at {str(pack_dir)!r}: {e}") from e
        runtime = doc.get("runtime")
        options = runtime.get("options", {}) if isinstance(runtime, dict) else {}
        venv = options.get("virtualenv") if isinstance(options, dict) else None
        return cls(version=str(doc.get("version") or ""), virtualenv=str(venv) if venv else None)

    def python(self, pack_dir: Path) -> str:
        """The pack's virtualenv python when it exists (what the shim runs), else this interpreter."""
        if self.virtualenv:
            candidate = (pack_dir / self.virtualenv / "bin" / "python").absolute()
            if candidate.exists():
                return str(candidate)
        return sys.executable


def reconcile_config(info: PackInfo, config: Mapping[str, Any]) -> dict[str, PolicyConfig]:
    """Resolve ``--policy-pack-config`` content into one ``PolicyConfig`` per policy, like the CLI.

    ``all`` sets every policy's level; a policy's own entry (a level string, or an object with an
    optional ``enforcementLevel`` and its properties) wins. Properties are checked against the
    policy's JSON schema. Every policy gets an explicit level, because the Python servicer reads a
    missing one as ``advisory``.
    """
    problems: list[str] = []
    all_level = config.get("all")
    if all_level is not None and all_level not in LEVELS:
        problems.append(f"all: enforcement level {all_level!r} is not one of {', '.join(LEVELS)}")
    out: dict[str, PolicyConfig] = {}
    for key in config:
        if key != "all" and info.policy(key) is None:
            problems.append(f"{key}: no policy of that name in {info.name}; policies: "
                            + ", ".join(p.name for p in info.policies))
    for policy in info.policies:
        entry = config.get(policy.name)
        level = all_level if all_level in LEVELS else policy.enforcement_level
        props: dict[str, Any] = {}
        if isinstance(entry, str):
            if entry not in LEVELS:
                problems.append(f"{policy.name}: enforcement level {entry!r} is not one of {', '.join(LEVELS)}")
            else:
                level = entry
        elif isinstance(entry, Mapping):
            props = {k: v for k, v in entry.items() if k != "enforcementLevel"}
            if "enforcementLevel" in entry:
                if entry["enforcementLevel"] not in LEVELS:
                    problems.append(f"{policy.name}.enforcementLevel: {entry['enforcementLevel']!r} is not one of "
                                    + ", ".join(LEVELS))
                else:
                    level = str(entry["enforcementLevel"])
            schema = {"type": "object", "properties": dict(policy.config_schema),
                      "required": list(policy.required), "additionalProperties": False}
            for err in jsonschema.Draft7Validator(schema).iter_errors(props):
                where = ".".join(str(p) for p in err.absolute_path)
                problems.append(f"{policy.name}{'.' + where if where else ''}: {err.message}")
        elif entry is not None:
            problems.append(f"{policy.name}: expected an enforcement level or an object, got {entry!r}")
        out[policy.name] = policy_config(level, props)
    if problems:
        raise PolicyConfigError(problems)
    return out


class PackProcess:
    """A running policy pack and a gRPC client to it; use as a context manager."""

    def __init__(
        self,
        pack_dir: Path = PACK_DIR,
        stack: StackContext | None = None,
        *,
        python: str | None = None,
        start_timeout: float = 60.0,
        call_timeout: float = 60.0,
    ) -> None:
        self.pack_dir = pack_dir.resolve()
        self.manifest = PackManifest.load(self.pack_dir)
        self.python = python or self.manifest.python(self.pack_dir)
        self.stack = stack
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._drain: threading.Thread | None = None
        self._config_dir: tempfile.TemporaryDirectory[str] | None = None
        self._channel: grpc.Channel | None = None
        self._stub: AnalyzerStub | None = None
        self.info: PackInfo | None = None
        #: Seconds from spawning the process to the first answered RPC.
        self.start_seconds = 0.0

    def __enter__(self) -> PackProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> PackInfo:
        env = dict(os.environ)
        for key in ("PULUMI_CONFIG", "PULUMI_PROJECT", "PULUMI_STACK", "PULUMI_DRY_RUN", CONFIG_FILE_ENV):
            env.pop(key, None)
        if self.stack is not None:
            # The config by file, never by environment (see StackContext.environment); gone in close().
            self._config_dir = tempfile.TemporaryDirectory(prefix="nvidia-gpu-pack-config-")
            env.update(self.stack.environment(Path(self._config_dir.name) / "config.json"))
        began = time.perf_counter()
        # Kept open for the pack's lifetime (closed in close()) so a failed start can quote it.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            [self.python, "-u", "-m", "pulumi.policy", OFFLINE_ENGINE_ADDRESS, "."],
            cwd=self.pack_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        port = self._read_port()
        # Keep reading stdout as the CLI does (it logs plugin output): a pack that prints must never block.
        self._drain = threading.Thread(target=self._drain_stdout, name="policy-pack-stdout", daemon=True)
        self._drain.start()
        self._channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 400 * 1024 * 1024)]
        )
        self._stub = AnalyzerStub(self._channel)
        try:
            self._handshake()
            self._configure_stack()
            self.info = self._analyzer_info()
        except grpc.RpcError as e:
            stderr = self._stderr_text()
            self.close()
            raise PackError(f"policy pack {self.pack_dir} broke the analyzer protocol: {e}\n{stderr}") from e
        self.start_seconds = time.perf_counter() - began
        log.debug("policy pack started pack=%s version=%s port=%s seconds=%.3f",
                  self.info.name, self.info.version, port, self.start_seconds)
        return self.info

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()

    def _read_port(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise PackError(f"policy pack {self.pack_dir} printed no port within {self.start_timeout:.0f}s")
            ready, _, _ = select.select([self._proc.stdout], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._proc.stdout.fileno(), 64)
            if not chunk:
                code = self._proc.wait()
                stderr = self._stderr_text()
                self.close()
                raise PackError(f"policy pack {self.pack_dir} failed to start (exit {code}):\n{stderr}")
            line += chunk
        text = line.decode(errors="replace").strip()
        try:
            return int(text)
        except ValueError:
            self.close()
            raise PackError(f"policy pack {self.pack_dir} printed {text!r} instead of its port") from None

    def _drain_stdout(self) -> None:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        fd = proc.stdout.fileno()
        try:
            while chunk := os.read(fd, 65536):
                log.debug("policy pack stdout=%r", chunk.decode(errors="replace"))
        except OSError:
            return  # closed by close()

    @property
    def stub(self) -> AnalyzerStub:
        if self._stub is None:
            raise PackError("policy pack is not running")
        return self._stub

    def _handshake(self) -> None:
        """The CLI's first call; packs that predate it answer UNIMPLEMENTED, which the CLI tolerates."""
        try:
            self.stub.handshake(engine_address=OFFLINE_ENGINE_ADDRESS, root_directory=str(self.pack_dir),
                                program_directory=str(self.pack_dir), timeout=self.start_timeout)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:  # type: ignore[attr-defined]
                raise

    def _configure_stack(self) -> None:
        """Stack, project, organization and config, as the CLI sends them before any analysis."""
        if self.stack is None:
            return
        self.stub.configure_stack(
            stack=self.stack.stack, project=self.stack.project, organization=self.stack.organization,
            dry_run=self.stack.dry_run, config=self.stack.flat_config(), timeout=self.call_timeout,
        )

    def _analyzer_info(self) -> PackInfo:
        info = self.stub.get_analyzer_info(timeout=self.start_timeout)
        # Like the CLI, the version in PulumiPolicy.yaml wins over the one the pack reports.
        return dataclasses.replace(info, version=self.manifest.version or info.version,
                                   policies=tuple(sorted(info.policies, key=lambda p: p.name)))

    def configure(self, config: Mapping[str, Any]) -> None:
        """Send ``--policy-pack-config`` content (``{"all": "...", "<policy>": ...}``); no call when empty."""
        if not config:
            return
        assert self.info is not None
        policy_config = reconcile_config(self.info, config)
        self.stub.configure(policy_config, timeout=self.call_timeout)

    def analyze(self, resource: AnalyzerResource) -> list[Diagnostic]:
        raw = self.stub.analyze(resource, timeout=self.call_timeout)
        return self._diagnostics(raw, {resource.urn: resource}, resource)

    def analyze_stack(self, resources: Sequence[AnalyzerResource]) -> list[Diagnostic]:
        # One call over the whole stack: its deadline grows with the stack (2,000 node groups, some 20,000
        # resources, passed a fixed minute).
        raw = self.stub.analyze_stack(resources,
                                      timeout=self.call_timeout + STACK_SECONDS_PER_RESOURCE * len(resources))
        return self._diagnostics(raw, {r.urn: r for r in resources})

    def analyze_all(self, resources: Sequence[AnalyzerResource]) -> list[Diagnostic]:
        """What a preview does: ``Analyze`` for each resource, then ``AnalyzeStack`` once. A call the pack
        fails or does not answer in time is a :class:`PackError` naming it, not a gRPC traceback."""
        out: list[Diagnostic] = []
        current = "Analyze"
        try:
            for r in resources:
                current = f"Analyze of {r.urn}"
                out.extend(self.analyze(r))
            current = f"AnalyzeStack of {len(resources)} resources"
            out.extend(self.analyze_stack(resources))
        except grpc.RpcError as e:
            code = e.code().name if hasattr(e, "code") else "UNKNOWN"
            details = e.details() if hasattr(e, "details") else str(e)
            raise PackError(f"policy pack {self.pack_dir}: {current} failed: {code}: {details}\n"
                            f"{self._stderr_text()}".rstrip()) from e
        return out

    def _diagnostics(
        self, raw: Sequence[ReportedDiagnostic], by_urn: Mapping[str, AnalyzerResource],
        analyzed: AnalyzerResource | None = None
    ) -> list[Diagnostic]:
        """``Analyze`` diagnostics without a URN belong to the analyzed resource, as the engine attributes them."""
        out = []
        for d in raw:
            resource = by_urn.get(d.urn) if d.urn else analyzed
            out.append(Diagnostic(
                policy_name=d.policy_name,
                pack_name=d.pack_name,
                pack_version=self.info.version if self.info and self.info.version else d.pack_version,
                description=d.description,
                message=d.message,
                enforcement_level=d.enforcement_level,
                urn=d.urn or (analyzed.urn if analyzed else ""),
                resource_type=resource.type if resource else "",
                resource_name=resource.name if resource else "",
            ))
        return out

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._stub = None
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if self._drain is not None:
                self._drain.join(timeout=5)
                self._drain = None
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._config_dir is not None:
            self._config_dir.cleanup()
            self._config_dir = None
