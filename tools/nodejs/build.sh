#!/usr/bin/env bash
# tools/build.sh runs this in tools/nodejs with the output directory as $1.
# cold: 15 s (two downloads from the npm registry: about 50 MB)
set -euo pipefail
out="$1"
# Node.js and npm for the TypeScript program of tests/cluster/test_component_sdks.py (the package's generated
# TypeScript SDK): @pulumi/pulumi needs Node.js 22 or newer, which distributions' packages are not. Both come
# from the npm registry, the one JavaScript source the tests reach: Node.js as the node-linux-<arch> package
# (the official build's bin/node), npm as its own package (its dependencies bundled), each checked against the
# integrity the registry published for it (pinned in fetch.py). No Go: this component only unpacks.
exec python3 fetch.py "$out"
