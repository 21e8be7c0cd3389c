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

CACHE=${GOODPUT_CACHE:-$HOME/.cache/goodput}
BIN="$CACHE/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-prom-$PROMETHEUS_VERSION-helm-$HELM_VERSION-keda-$KEDA_VERSION"
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

# build NAME DIR PACKAGE [LDFLAGS] [TAGS]: builds one program unless its binary is already cached.
build() {
  local name=$1 dir=$2 package=$3 ldflags=${4:-"-s -w"} tags=${5:-""}
  if [[ -x "$BIN/$name" ]]; then step "$name: cached"; return; fi
  step "$name: building $package (the first build takes minutes)"
  local started=$SECONDS
  (cd "$here/$dir" && go build -trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags" -o "$BIN/$name.partial" "$package")
  mv "$BIN/$name.partial" "$BIN/$name"
  step "$name: built in $((SECONDS - started)) s"
}

k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  k8s_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=module-build -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
k8s_tags=selinux,notest,grpcnotrace

build etcd etcd go.etcd.io/etcd/server/v3
build kwok kwok sigs.k8s.io/kwok/cmd/kwok
build kube-apiserver k8s k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags" "$k8s_tags"
build kube-scheduler k8s k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags" "$k8s_tags"
build kube-controller-manager k8s k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags" "$k8s_tags"
build kubectl k8s k8s.io/kubernetes/cmd/kubectl "$k8s_ldflags" "$k8s_tags"
build prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus
build helm helm helm.sh/helm/v3/cmd/helm "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=36 \
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=36"

build keda-operator keda github.com/kedacore/keda/v2/cmd/operator
build keda-adapter keda github.com/kedacore/keda/v2/cmd/adapter

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
step "all binaries in $BIN"
echo "$BIN"
