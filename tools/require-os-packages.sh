#!/usr/bin/env bash
# Checks for the OS tools that `make test` and `make demo` need and that no language registry ships,
# and installs the missing ones with apt-get (Debian) when run as root; otherwise says what to install.
# Go is checked, not installed: the binaries need Go 1.26, newer than Debian's package.
set -euo pipefail

# command:package
needed=(python3:python3 ip:iproute2 openssl:openssl git:git)
missing=()
for pair in "${needed[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)

if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "os-packages: installing ${missing[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "os-packages: missing ${missing[*]}: install them (Debian: apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

if ! command -v go >/dev/null 2>&1; then
  echo "os-packages: Go 1.26 or newer is needed to build the local cluster's binaries (https://go.dev/dl)" >&2
  exit 1
fi
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if ((go_minor < 26)); then
  echo "os-packages: Go $(go env GOVERSION) is too old: the binaries need Go 1.26 or newer" >&2
  exit 1
fi
