# The two commands a user needs: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
# The folder `operator/` would shadow the standard library's `operator` for any `python -m` run from
# the repository root; never put the working directory on sys.path (Python 3.11's safe-path mode).
export PYTHONSAFEPATH := 1
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LAYERS := api estimators controllers operator simulator gateway testbed agent
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml testbed/pyproject.toml | sha256sum | cut -c1-12)

.PHONY: test demo demo-sim ab bench bench-draws venv lint typecheck layers unit e2e binaries os-packages fresh-check crds clean chaos chart chart-package wheel

# Every set-up step is a prerequisite of the step that needs it, so `make test` on a fresh machine
# installs the OS tools, creates the virtual environment and builds the cluster's binaries (the chart
# tests in `unit` run helm and kubectl) before anything uses them. The unit tests run before the
# stories, not beside them: on two cores, three clusters leave the unit tests (even at nice 10) too
# little CPU for hypothesis's per-example deadlines, and the stories' own timings are squeezed; one
# fresh-clone run that way took 1741 s and failed on both counts.
test: lint typecheck layers unit e2e

venv: $(STAMP)
$(STAMP): pyproject.toml testbed/pyproject.toml | os-packages
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# goodput, and beside it the test bed (a distribution of its own, never in goodput's wheel).
	$(PY) -m pip install -q -e '.[dev]' -e ./testbed
	# A tree of folder links that maps each layer under `goodput`, so mypy and import-linter see the
	# same package the interpreter imports (setuptools' editable finder is invisible to them).
	rm -rf build/pkgroot && mkdir -p build/pkgroot/goodput
	for layer in $(LAYERS); do ln -sfn ../../../$$layer build/pkgroot/goodput/$$layer; done
	echo "$(CURDIR)/build/pkgroot" > $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/goodput-pkgroot.pth
	touch $@

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	MYPYPATH=build/pkgroot $(VENV)/bin/mypy $(addprefix -p goodput.,$(LAYERS))
	MYPYPATH=build/pkgroot $(VENV)/bin/mypy e2e bench

layers: venv
	$(VENV)/bin/lint-imports

# The unit tests run on UNIT_WORKERS workers (pytest-xdist; an idle worker takes tests queued for
# the other, so the two long envelope searches do not end up one after the other); `UNIT_WORKERS=0`
# runs them in one process.
UNIT_WORKERS ?= 2
unit: venv binaries
	$(VENV)/bin/pytest -q $(if $(filter 0,$(UNIT_WORKERS)),,-n $(UNIT_WORKERS) --dist worksteal) tests

# The OS tools the test bed runs (iproute2, openssl), installed with apt-get when missing.
os-packages:
	tools/require-os-packages.sh

binaries: os-packages
	tools/build-binaries.sh

# The stories run on E2E_WORKERS workers (pytest-xdist), each with a local cluster of its own, a file at
# a time, the longest first (e2e/conftest.py): most of a story is waiting on the cluster's clocks, so
# the workers overlap their waits. `E2E_WORKERS=0` runs them one by one on one cluster. The 30 longest
# stories are listed at the end, for the file order above and for finding what to shorten.
E2E_WORKERS ?= 3
e2e: venv binaries
	$(VENV)/bin/pytest -q --durations=30 $(if $(filter 0,$(E2E_WORKERS)),,-n $(E2E_WORKERS) --dist loadfile --no-loadscope-reorder) e2e

# What CI and a new contributor go through: a clone of HEAD with an empty binary cache, then
# `make test`. Measured on two cores (docs/benchmarks.md, "How long the tests take"): `make test` from
# a fresh clone of 5160745 with Go's caches shared took 1814 s, passed (unit on two workers 262 s,
# e2e on three workers 1357 s); the
# first build of the binaries with nothing cached took 41 minutes before Prometheus was built without
# the service discoveries the test bed does not use.
fresh-check:
	tools/fresh-machine-check.sh

# The CRDs are rendered from the API models; the chart's copy and the kustomize base follow them.
crds: venv
	$(VENV)/bin/goodput crds
	$(PY) manifests/render.py

# The public traces live beside the repository (../shared/traces); `goodput demo` falls back to a
# seeded synthetic trace, and says so, when they are absent.
TRACES ?= ../shared/traces

# The whole loop: local cluster, operator from the chart, emulated vLLM fleet, a replayed trace.
demo: venv binaries
	$(VENV)/bin/goodput demo --out out/demo

# goodput, the real KEDA and the real HPA, one after another on one local cluster and the demo's replay
# (issue #19): one table and one plot in out/ab.
ab: venv binaries
	$(VENV)/bin/goodput ab --out out/ab

# Scaling policies side by side in the fleet simulator: minutes 20-40 of the conversation trace at 8x.
demo-sim: venv
	$(VENV)/bin/goodput bench --trace $(TRACES)/AzureLLMInferenceTrace_conv.csv \
	  --start-seconds 1200 --duration-seconds 1200 --rate-multiplier 8 \
	  --modelgroup manifests/samples/modelgroup-llama-8b-tp1.yaml \
	  --policy manifests/samples/slopolicy-interactive.yaml --out out/demo-sim

# The fair benchmark suite: whole days of the rate traces under $(TRACES) at their own time scale
# and bursts on a diurnal day, both sample ModelGroups, each policy tuned on the training day and
# reported on the test day, with the hindsight oracle. Hours on 2 cores: a real-time day of the 8B
# sample is millions of requests (bench/bench_realtime_day.py measures one).
# Writes out/bench/table.md, results.json and the cost-versus-attainment plots.
# SEED (default 0, the run docs/benchmarks.md reports) draws every case anew.
SEED ?= 0
bench: venv
	$(PY) bench/bench_suite.py --traces $(TRACES) --out out/bench --workers 2 --seed $(SEED)

# The suite once per seed in SEEDS (each as long as `make bench`), and each case's verdict
# side by side in out/bench-draws/draws.md: whether it holds in every draw or turns with one.
SEEDS ?= 0 1 2
bench-draws: venv
	for seed in $(SEEDS); do \
	  $(PY) bench/bench_suite.py --traces $(TRACES) --out out/bench-draws/seed-$$seed --workers 2 --seed $$seed || exit 1; \
	done
	$(PY) bench/bench_draws.py --out out/bench-draws/draws.md $(foreach seed,$(SEEDS),out/bench-draws/seed-$(seed)/results.json)

# The chaos run (issue #18): seeded faults against a throwaway local cluster, the live emulator and
# streaming load, invariants checked every second, a report in out/chaos. CHAOS_SECONDS (default 900)
# and CHAOS_SEED (default: drawn and printed) repeat a run; `make test` runs a short one (e2e/test_chaos.py).
chaos: venv binaries
	$(PY) -m goodput.testbed.chaos --out out/chaos

clean:
	rm -rf $(VENV) out

# goodput's wheel, out/goodput-<version>-py3-none-any.whl: the `goodput` command for a workstation
# (`pipx install out/goodput-0.1.0-py3-none-any.whl`), without the test bed.
wheel: venv
	$(PY) -m pip wheel --no-deps --wheel-dir out .

# The chart as a versioned artifact: linted strictly, then packaged by helm as
# out/goodput-<version>.tgz (the version of charts/goodput/Chart.yaml), to install as it is
# (`helm install goodput out/goodput-0.1.0.tgz`) or to push to a chart repository or OCI registry
# (`helm push`). helm is the one tools/build-binaries.sh builds.
CHART_VERSION := $(shell sed -n 's/^version: *//p' charts/goodput/Chart.yaml)
CHART_OUT ?= out
HELM ?= $(shell tools/build-binaries.sh --print-bin-dir)/helm
chart: binaries
	@$(MAKE) --no-print-directory chart-package

chart-package:
	$(HELM) lint --strict charts/goodput
	mkdir -p $(CHART_OUT)
	$(HELM) package charts/goodput --destination $(CHART_OUT)
	@test -s $(CHART_OUT)/goodput-$(CHART_VERSION).tgz && echo "$(CHART_OUT)/goodput-$(CHART_VERSION).tgz"

# The operator's image, built without a Docker daemon: a base of Debian packages (mmdebstrap, as no
# container registry need be reachable), then the Containerfile with buildah (chroot isolation, its
# storage under out/image), written as an OCI archive. Repository and tag are the chart's defaults
# (image.repository, appVersion), so `helm install` on a cluster that loaded the archive runs it.
# The archive's layers are compressed at gzip's fastest level (it is read on the machine that wrote
# it: a cluster's runtime imports it, the chart's e2e story unpacks it; buildah writes an OCI archive
# compressed even when told not to), and dpkg skips its fsyncs while it fills the base's tree (a
# tarball, not a system that must survive a power cut).
# One build at a time: `make image` waits for a build already running (the e2e session starts one in
# the background, e2e/conftest.py); `image-build` is the build itself, for a caller that holds
# $(IMAGE_LOCK).
IMAGE_REPOSITORY := ghcr.io/goodput-dev/goodput
IMAGE_TAG := $(shell sed -n 's/^appVersion: "\(.*\)"$$/\1/p' charts/goodput/Chart.yaml)
IMAGE_OUT := out/image
IMAGE_ARCHIVE := $(IMAGE_OUT)/goodput-$(IMAGE_TAG).oci.tar
IMAGE_LOCK := $(IMAGE_OUT)/.build.lock
DEBIAN_SUITE ?= bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
# The host's CA bundle, lent to the build's pip (for a TLS-inspecting proxy on the way to PyPI).
BUILD_CA_BUNDLE ?= $(firstword $(wildcard /etc/ssl/certs/ca-certificates.crt))
BUILDAH := buildah --root $(CURDIR)/$(IMAGE_OUT)/storage --runroot $(CURDIR)/$(IMAGE_OUT)/run --storage-driver vfs

.PHONY: image image-build
image:
	mkdir -p $(IMAGE_OUT)
	flock $(IMAGE_LOCK) $(MAKE) --no-print-directory image-build

image-build:
	@missing=""; for tool in buildah mmdebstrap; do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make image: installing$$missing with apt-get (Debian packages buildah and mmdebstrap)"; \
	  { apt-get update -qq && apt-get install -y --no-install-recommends$$missing; } || { echo "make image needs$$missing: apt-get install -y$$missing"; exit 1; }; \
	fi
	mkdir -p $(IMAGE_OUT)
	test -s $(IMAGE_OUT)/base-$(DEBIAN_SUITE).tar || mmdebstrap --variant=minbase \
	  --include=python3,python3-venv,ca-certificates --dpkgopt=force-unsafe-io \
	  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
	  --dpkgopt='path-exclude=/usr/share/locale/*' \
	  $(DEBIAN_SUITE) $(IMAGE_OUT)/base-$(DEBIAN_SUITE).tar $(DEBIAN_MIRROR)
	base=$$($(BUILDAH) from scratch) && $(BUILDAH) add $$base $(IMAGE_OUT)/base-$(DEBIAN_SUITE).tar / \
	  && $(BUILDAH) commit --rm $$base localhost/goodput-base:$(DEBIAN_SUITE)
	$(BUILDAH) build --isolation chroot --pull-never --build-arg BASE=localhost/goodput-base:$(DEBIAN_SUITE) \
	  $(if $(BUILD_CA_BUNDLE),--volume $(BUILD_CA_BUNDLE):/run/build-ca.crt:ro --build-arg PIP_CERT=/run/build-ca.crt) \
	  --build-arg VERSION=$(IMAGE_TAG) -f Containerfile -t $(IMAGE_REPOSITORY):$(IMAGE_TAG) .
	rm -f $(IMAGE_ARCHIVE)
	$(BUILDAH) push --compression-format gzip --compression-level 1 $(IMAGE_REPOSITORY):$(IMAGE_TAG) \
	  oci-archive:$(IMAGE_ARCHIVE):$(IMAGE_REPOSITORY):$(IMAGE_TAG)
	@echo "$(IMAGE_ARCHIVE): $(IMAGE_REPOSITORY):$(IMAGE_TAG)"
