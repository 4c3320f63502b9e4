# nvidia-gpu: everything runs from the project's own virtualenv, created on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STACK ?= dev

.PHONY: venv deps preview test check unit cluster-test compare-test image-test compare lint policy-test policy-pack policy-pack-cache policy-publish bench clean proto tools cluster-up cluster-down docs docs-serve docs-reference

$(VENV)/.installed: requirements.txt requirements-agent.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check --upgrade pip
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

## The main job: render and validate the stack offline (no Pulumi CLI, no cluster).
preview: venv
	$(PY) -m nvidia_gpu.preview --stack $(STACK)

## gRPC stubs for the kubelet protocols (also generated on first import; the agent image runs this at build time).
proto: venv
	$(PY) -m node_agent.kubelet.codegen

## The pinned real components (kube-apiserver, scheduler, controller-manager, etcd, kwok; a real node's kubelet,
## containerd, runc, CNI plugins and crictl; the rest listed in docs/contributing/index.md) from their Go
## modules, built into a cache outside the clone ($$XDG_CACHE_HOME/nvidia-gpu/tools); the last line printed
## is the binary directory. Cold: about 30 minutes on 2 cores; warm: a second. `make deps` first (runc needs libseccomp).
tools: deps
	@bash tools/build.sh

## A local control plane in the background (out/cluster/kubeconfig is cluster-admin); cluster-down stops it.
## NODES="gpu1:dgx-h100 worker1" adds real nodes (root): containerd and the kubelet in namespaces of their
## own, NAME:MACHINE a GPU node with that machine's simulated driver (python -m localcluster node --help).
NODES ?=
cluster-up: venv tools
	$(PY) -m localcluster up
	@for n in $(NODES); do \
	  case "$$n" in *:*) $(PY) -m localcluster node add "$${n%%:*}" --machine "$${n#*:}" ;; \
	                 *) $(PY) -m localcluster node add "$$n" ;; esac || exit 1; \
	done

cluster-down: venv
	$(PY) -m localcluster down

## What the tests need from the machine (shellcheck, openssl, buildah, debootstrap, gcc, Go): checked every
## run, installed with apt-get when root on Debian/Ubuntu, otherwise one line naming what to install.
deps:
	@bash tools/deps.sh

## Everything CI runs: lint, types, layers, and every test, the cluster tests against the real control plane.
## The first run on a fresh machine also installs deps and builds the tools (docs/getting-started/index.md).
test: deps venv tools policy-pack-cache lint
	NVIDIA_GPU_REQUIRE_CLUSTER=1 $(PY) -m pytest -q

## The fast loop: lint, types, layers and the unit tests (no Go, no control plane): under 3 minutes on 2 cores.
check: lint unit

## The fast tests only (no control plane), on UNIT_WORKERS processes: many of them wait on subprocesses
## and sockets, so four keep two cores busy (measured: 1 min 56 s on 2 cores, 2 min 58 s with two).
UNIT_WORKERS ?= 4
unit: venv
	$(PY) -m pytest -q -n $(UNIT_WORKERS) --dist worksteal -m "not cluster and not compare and not image"

## NVIDIA's device plugin/GFD/mig-parted/DRA plugin beside ours on one mock machine: the comparison report
## (its tests, marked compare, run in make test; the known differences are docs/compatibility.md).
compare: venv tools
	$(PY) -m tests.compare.report

## The test tiers one at a time (make test runs them all; the GitHub workflow runs each as a job of its own).
## cluster: the real control plane, Pulumi engine and kubelet (make tools; some tests need root);
## compare: NVIDIA's own programs beside ours (make tools; root); image: the agent image (root, buildah).
cluster-test: venv tools policy-pack-cache
	NVIDIA_GPU_REQUIRE_CLUSTER=1 $(PY) -m pytest -q -m "cluster and not compare and not image"

compare-test: venv tools
	NVIDIA_GPU_REQUIRE_CLUSTER=1 $(PY) -m pytest -q -m "compare"

image-test: deps venv tools
	NVIDIA_GPU_REQUIRE_CLUSTER=1 $(PY) -m pytest -q -m "image and not compare"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --explicit-package-bases nvgpu node_agent nvidia_gpu localcluster nvml_sim tests
	$(VENV)/bin/lint-imports

policy-test: venv
	$(PY) -m pytest -q tests/nvidia_gpu/policies

## The policy pack to publish: out/policy-pack/, self-contained (PulumiPolicy.yaml, __main__.py and config.json
## as in policies/, the rules as a wheel of their own, requirements pinned; tools/policypack.py says more).
policy-pack: venv
	$(PY) tools/policypack.py build

## What the pack's tests need, fetched once (network): its pinned wheels for offline installs, and the Pulumi
## CLI's archive code built as a program (from tools/pulumi's modules) that lists what publish uploads.
policy-pack-cache: venv
	$(PY) tools/policypack.py cache

## `pulumi policy publish` of that pack (logged in to the Pulumi Cloud; ORG=<organization>, default: yours),
## from a temporary directory: the CLI leaves out what any .gitignore above the pack ignores, here out/.
policy-publish: venv
	$(PY) tools/policypack.py publish $(ORG)

## The reference pages under docs/reference/ (stack config, the agent's command line, metrics, alerts, labels),
## generated from the code they document (tools/gendocs.py); tests/repo/test_docs_reference.py fails when one is stale.
docs-reference: venv
	$(PY) tools/gendocs.py

## The documentation site (mkdocs.yml, docs/): built in strict mode, so a broken link or anchor or a page missing
## from the nav fails it (tests/repo/test_docs_site.py builds it too, in make check); open out/site/index.html.
## NO_MKDOCS_2_WARNING: Material prints its end-of-life notice on every build otherwise.
DOCS_DIR ?= out/site
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(DOCS_DIR)

## A live preview of the site while you edit (http://127.0.0.1:8000); warnings are shown, not fatal.
docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

bench: venv
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf out .mypy_cache .ruff_cache
