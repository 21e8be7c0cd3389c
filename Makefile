# The two commands a user needs: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)

.PHONY: test demo venv lint typecheck layers unit e2e binaries crds clean

test: lint typecheck layers unit e2e

venv: $(STAMP)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy api estimators controllers operator simulator cluster

layers: venv
	$(VENV)/bin/lint-imports

unit: venv
	$(VENV)/bin/pytest -q tests

binaries:
	tools/build-binaries.sh

e2e: venv binaries
	$(VENV)/bin/pytest -q e2e

crds: venv
	$(VENV)/bin/goodput crds

demo: venv
	$(VENV)/bin/goodput bench --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv --out out/demo

clean:
	rm -rf $(VENV) out
