#!/usr/bin/env bash
# The fresh-machine check: a clone of HEAD with an empty binary cache, then `make test`, as a new
# contributor or CI on a new machine would run it. Nothing from this checkout's .venv, build/ or the
# binary cache under ~/.cache/goodput is used. Usage:
#   tools/fresh-machine-check.sh [--reuse-go-cache] [WORK_DIR]
# --reuse-go-cache shares Go's module and build caches of ~/.cache/goodput, so the binaries are still
# built anew into an empty cache (every step of `make test` runs) but without recompiling Kubernetes
# and the rest (41 minutes of compiling and downloading on two busy cores, measured with nothing
# cached); without it nothing at all is reused. `make test` itself took 1814 s from a fresh clone of
# 5160745 with the Go caches shared (docs/benchmarks.md, "How long the tests take").
set -euo pipefail

if [[ "${1:-}" == "--reuse-go-cache" ]]; then
  shift
  export GOODPUT_GOMODCACHE="$HOME/.cache/goodput/go/mod" GOODPUT_GOCACHE="$HOME/.cache/goodput/go/build"
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d /tmp/goodput-fresh.XXXXXX)}
mkdir -p "$work"
step() { printf '[fresh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

step "cloning $(git -C "$repo" rev-parse --short HEAD) into $work/goodput"
git clone -q --no-local "$repo" "$work/goodput"
# The public traces live beside the repository; the clone sees the same ones.
[[ -e "$repo/../shared" && ! -e "$work/shared" ]] && ln -s "$(cd "$repo/../shared" && pwd)" "$work/shared"

export GOODPUT_CACHE="$work/cache"
step "empty binary cache at $GOODPUT_CACHE; running make test"
started=$SECONDS
cd "$work/goodput"
if make test; then
  step "make test passed from a fresh clone in $((SECONDS - started)) s"
else
  status=$?
  step "make test FAILED from a fresh clone after $((SECONDS - started)) s (exit $status)"
  exit "$status"
fi
