# nvidia-gpu: everything runs from the project's own virtualenv, created on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STACK ?= dev

.PHONY: venv preview test unit lint policy-test bench clean proto

$(VENV)/.installed: requirements.txt requirements-agent.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check --upgrade pip
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

## The main job: render and validate the stack offline (no Pulumi CLI, no cluster).
preview: venv
	$(PY) -m preview --stack $(STACK)

## gRPC stubs for the kubelet protocols (also generated on first import; the agent image runs this at build time).
proto: venv
	$(PY) -m node_agent.kubelet.codegen
	$(PY) -m node_agent.kubelet.dra.protos

## Everything CI runs.
test: venv lint unit

unit: venv
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy nvgpu node_agent components preview policies
	$(VENV)/bin/lint-imports

policy-test: venv
	$(PY) -m pytest -q tests/policies

bench: venv
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf out .mypy_cache .ruff_cache
