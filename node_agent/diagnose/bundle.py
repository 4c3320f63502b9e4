"""The support bundle: the report and the raw files it read, in one tar.gz a person can attach to a ticket."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The report inside the archive; the host files follow under ``host/`` by their host path.
REPORT_NAME = "diagnose.json"


def write_bundle(path: Path, report: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
    """Write ``path`` (a new file, replaced atomically): ``diagnose.json`` and ``host/<path>`` for each file."""
    now = time.time()
    tmp = path.with_name(f".{path.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(now), 0o644
            tar.addfile(info, io.BytesIO(data))

        add(REPORT_NAME, json.dumps(report, indent=2, sort_keys=True).encode())
        for host_path, data in sorted(files.items()):
            add("host/" + host_path.lstrip("/"), data)
    tmp.replace(path)
