#!/usr/bin/env bash
# Builds the local cluster's binaries from their Go modules, pinned by the wrapper modules under
# tools/, into a cache outside the repository keyed by each program's version. A second run finds
# every binary in place and returns at once. Usage: tools/build-binaries.sh [--print-bin-dir]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
PROMETHEUS_VERSION=v0.316.0   # the Go module's v0.316.0 is Prometheus 3.16.0
HELM_VERSION=v3.22.0
KEDA_VERSION=v2.21.0      # the live A/B run's peer autoscaler: its operator and metrics API server
KARPENTER_VERSION=v1.15.0 # the node autoscaler of the nodes-on-demand story: its KWOK cloud provider
# Karpenter v1.15.0's go.mod asks for Go 1.26.9: its one `go build` runs on this toolchain, which the
# go command takes from the Go module proxy like any module; every other build keeps the machine's Go.
KARPENTER_GOTOOLCHAIN=go1.27.3
# The Gateway API Inference Extension's release whose InferencePool CRD the endpoint picker's story
# installs (nothing of it is built: its Go module is downloaded for the CRD alone).
INFERENCE_EXTENSION_VERSION=v1.6.2

# The build's own generation: raised whenever how a program is built changes (flags, tags), so that a
# binary built the old way is not taken from the cache. 2: Prometheus with only the service discoveries
# the test bed uses; Kubernetes and KEDA each in one `go build`.
BUILD_GENERATION=2

CACHE=${GOODPUT_CACHE:-$HOME/.cache/goodput}
BIN="$CACHE/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-prom-$PROMETHEUS_VERSION-helm-$HELM_VERSION-keda-$KEDA_VERSION-karpenter-$KARPENTER_VERSION-b$BUILD_GENERATION"
case "${1:-}" in
  --print-bin-dir) echo "$BIN"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-bin-dir]" >&2; exit 2 ;;
esac

# Go's module and build caches live in the cache too, unless given (the fresh-machine check may
# share them to skip recompiling, while the binaries themselves are built anew).
export GOMODCACHE=${GOODPUT_GOMODCACHE:-$CACHE/go/mod} GOCACHE=${GOODPUT_GOCACHE:-$CACHE/go/build}
export GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE"
# One build of a cache at a time: a second run (another test session, make -j) waits for the first
# and then finds its binaries cached, instead of writing the same files at once.
exec 9>"$BIN/.build.lock"
if ! flock -n 9; then
  printf '[build %s] another build of %s is running; waiting for it\n' "$(date +%H:%M:%S)" "$BIN" >&2
  flock 9
fi

step() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# build DIR LDFLAGS TAGS NAME=PACKAGE...: builds the programs of one wrapper module whose binaries are
# not cached yet, in one `go build` (packages they share are compiled once, and one program links
# while the next compiles). A program is named after its package's last element, renamed to NAME.
# GOTOOLCHAIN, when set by the caller for one wrapper, is the Go that builds it.
build() {
  local dir=$1 ldflags=$2 tags=$3; shift 3
  local names=() packages=() pair
  for pair in "$@"; do
    if [[ -x "$BIN/${pair%%=*}" ]]; then step "${pair%%=*}: cached"; continue; fi
    names+=("${pair%%=*}"); packages+=("${pair#*=}")
  done
  [[ ${#names[@]} -gt 0 ]] || return 0
  step "${names[*]}: building ${packages[*]} (the first build takes minutes)"
  local started=$SECONDS partial="$BIN/.partial-$dir" i
  rm -rf "$partial" && mkdir -p "$partial"
  (cd "$here/$dir" && GOTOOLCHAIN=${GOTOOLCHAIN:-local} go build -trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags" -o "$partial/" "${packages[@]}")
  for i in "${!names[@]}"; do mv "$partial/$(exec_name "${packages[$i]}")" "$BIN/${names[$i]}"; done
  rm -rf "$partial"
  step "${names[*]}: built in $((SECONDS - started)) s"
}

# exec_name PACKAGE: the file `go build -o DIR/` writes, the last element of the path but a /vN suffix.
exec_name() {
  local path=$1
  [[ ${path##*/} =~ ^v[0-9]+$ ]] && path=${path%/*}
  echo "${path##*/}"
}

# prefetch DIR TAGS PACKAGE...: loads the packages' modules, so that downloads for a later build run
# while an earlier one compiles.
prefetch() {
  local dir=$1 tags=$2; shift 2
  (cd "$here/$dir" && go list -deps ${tags:+-tags "$tags"} "$@" >/dev/null)
}

k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=module-build -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
k8s_tags=selinux,notest,grpcnotrace

# Prometheus's plugins/ honour build tags: every service discovery but Kubernetes is left out (the
# test bed's jobs use kubernetes_sd_configs and file_sd_configs, which is always built in): 69 MB of Go
# source to compile instead of 149 MB (`go list -deps`), a 76 MB binary instead of 105 MB.
prom_tags=remove_all_sd,enable_kubernetes_sd
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=36 \
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=36"
k8s_programs=(kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager kubectl=k8s.io/kubernetes/cmd/kubectl)
keda_programs=(keda-operator=github.com/kedacore/keda/v2/cmd/operator keda-adapter=github.com/kedacore/keda/v2/cmd/adapter)

prefetcher=""
if [[ ! -x "$BIN/keda-adapter" || ! -x "$BIN/prometheus" || ! -x "$BIN/kube-apiserver" ]]; then
  # One module download at a time beside the compiles, in build order: every module of the six
  # wrappers took 198 s one after another and 239 s all at once (`go mod download`, empty cache).
  {
    prefetch kwok "" sigs.k8s.io/kwok/cmd/kwok
    prefetch k8s "$k8s_tags" "${k8s_programs[@]#*=}"
    prefetch prometheus "$prom_tags" github.com/prometheus/prometheus/cmd/prometheus
    prefetch helm "" helm.sh/helm/v3/cmd/helm
    prefetch keda "" "${keda_programs[@]#*=}"
  } 2>/dev/null &
  prefetcher=$!
fi

build etcd "-s -w" "" etcd=go.etcd.io/etcd/server/v3
build kwok "-s -w" "" kwok=sigs.k8s.io/kwok/cmd/kwok
build k8s "$k8s_ldflags" "$k8s_tags" "${k8s_programs[@]}"
build prometheus "-s -w" "$prom_tags" prometheus=github.com/prometheus/prometheus/cmd/prometheus
build helm "$helm_ldflags" "" helm=helm.sh/helm/v3/cmd/helm
build keda "-s -w" "" "${keda_programs[@]}"
GOTOOLCHAIN=$KARPENTER_GOTOOLCHAIN build karpenter "-s -w" "" karpenter=sigs.k8s.io/karpenter/kwok
# A failed prefetch is the build's to report (each `go build` downloads what it lacks).
[[ -z "$prefetcher" ]] || wait "$prefetcher" || true

# kwok's stock stage files ship inside its module; keep the ones of the same version beside the binary.
if [[ ! -d "$BIN/kwok-stages" ]]; then
  cp -r "$GOMODCACHE/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage" "$BIN/kwok-stages.partial"
  chmod -R u+w "$BIN/kwok-stages.partial" && mv "$BIN/kwok-stages.partial" "$BIN/kwok-stages"
fi
# KEDA's CRDs (ScaledObject and the rest) ship inside its module, like kwok's stages.
if [[ ! -d "$BIN/keda-crds" ]]; then
  cp -r "$GOMODCACHE/github.com/kedacore/keda/v2@$KEDA_VERSION/config/crd/bases" "$BIN/keda-crds.partial"
  chmod -R u+w "$BIN/keda-crds.partial" && mv "$BIN/keda-crds.partial" "$BIN/keda-crds"
fi
# Karpenter's CRDs (NodePool, NodeClaim, NodeOverlay, CapacityBuffer) and its KWOK provider's
# KWOKNodeClass ship inside its module, like KEDA's.
if [[ ! -d "$BIN/karpenter-crds" ]]; then
  mkdir -p "$BIN/karpenter-crds.partial"
  karpenter_src="$GOMODCACHE/sigs.k8s.io/karpenter@$KARPENTER_VERSION"
  cp "$karpenter_src"/pkg/apis/crds/*.yaml "$karpenter_src"/kwok/apis/crds/*.yaml "$BIN/karpenter-crds.partial/"
  chmod -R u+w "$BIN/karpenter-crds.partial" && mv "$BIN/karpenter-crds.partial" "$BIN/karpenter-crds"
fi
# The InferencePool CRD ships inside the inference extension's module, like KEDA's CRDs.
if [[ ! -d "$BIN/inference-crds" ]]; then
  inference_src=$(go mod download -json "sigs.k8s.io/gateway-api-inference-extension@$INFERENCE_EXTENSION_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$BIN/inference-crds.partial"
  cp "$inference_src"/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml "$BIN/inference-crds.partial/"
  chmod -R u+w "$BIN/inference-crds.partial" && mv "$BIN/inference-crds.partial" "$BIN/inference-crds"
fi
step "all binaries in $BIN"
echo "$BIN"
