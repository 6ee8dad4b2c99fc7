#!/usr/bin/env bash
# Builds Kubernetes' own control plane for the suite from its Go modules, with the machine's Go:
# kube-apiserver, kube-scheduler and kubectl of the release pinned in tools/kubernetes/go.mod,
# etcd of the release that one requires (tools/etcd), and Helm of tools/helm/go.mod (the
# chart in deploy/chart is linted, rendered and installed with it), into
# target/tools/kubernetes/bin.
# Skipped when the binaries there were built from the same pins; Go's build cache makes a
# rebuild after a pin change, or in a fresh clone on a warm machine, a matter of linking.
# Also the CustomResourceDefinitions deploy/ uses (PodMonitor, PrometheusRule), taken from
# prometheus-operator's Go module into target/tools/kubernetes/crds for the server-side dry
# run of every overlay. Used by scripts/setup.sh; Go builds these tools only, never podstream.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/target/tools/kubernetes"
pins=("$root/tools/kubernetes/go.mod" "$root/tools/kubernetes/go.sum" \
    "$root/tools/etcd/go.mod" "$root/tools/etcd/go.sum" "$root/tools/etcd/main.go" \
    "$root/tools/helm/go.mod" "$root/tools/helm/go.sum")

if ! command -v go >/dev/null 2>&1; then
    echo "setup: go is not on PATH; the suite's kube-apiserver, etcd and kubectl are built with it" >&2
    exit 1
fi
release="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$root/tools/kubernetes/go.mod")"
[ -n "$release" ] || { echo "setup: no k8s.io/kubernetes release in tools/kubernetes/go.mod" >&2; exit 1; }
helm_release="$(awk '$1 == "require" && $2 == "helm.sh/helm/v4" {print $3}' "$root/tools/helm/go.mod")"
[ -n "$helm_release" ] || { echo "setup: no helm.sh/helm/v4 release in tools/helm/go.mod" >&2; exit 1; }
PROMETHEUS_OPERATOR_VERSION="v0.85.0"
crds="$out/crds"
if [ ! -f "$crds/$PROMETHEUS_OPERATOR_VERSION" ]; then
    mkdir -p "$out"
    module="$(cd "$out" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" \
        | awk -F'"' '$2 == "Dir" {print $4}')"
    [ -d "$module" ] || { echo "setup: prometheus-operator $PROMETHEUS_OPERATOR_VERSION did not download" >&2; exit 1; }
    rm -rf "$crds" && mkdir -p "$crds"
    for kind in podmonitors prometheusrules; do
        cp "$module/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$crds/"
    done
    chmod u+w "$crds"/*.yaml
    touch "$crds/$PROMETHEUS_OPERATOR_VERSION"
fi

stamp="$(cat "${pins[@]}" | sha256sum | cut -d' ' -f1) $(go env GOVERSION)"
if [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "setup: kube-apiserver $("$out/bin/kube-apiserver" --version 2>/dev/null | cut -d' ' -f2), etcd, kubectl and helm $helm_release (built)"
    exit 0
fi

echo "setup: building kube-apiserver, kube-scheduler and kubectl $release, etcd and helm $helm_release with $(go env GOVERSION)"
echo "setup: (the first build on a machine takes 5 to 10 minutes on 2 cores; later ones, seconds)"
mkdir -p "$out/bin"
rm -f "$out/stamp"
started=$SECONDS
# The version stamps Kubernetes' own build sets (hack/lib/version.sh), so servers and clients
# report the release they are: kubectl's version skew check and the API's /version read them.
minor="${release#v1.}"; minor="${minor%%.*}"
ldflags=""
for package in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X $package.gitVersion=$release -X $package.gitMajor=1 -X $package.gitMinor=$minor"
    ldflags+=" -X $package.gitTreeState=clean -X $package.buildDate=1970-01-01T00:00:00Z"
done
(cd "$root/tools/kubernetes" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
(cd "$root/tools/etcd" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$out/bin/etcd" .)
(cd "$root/tools/helm" && CGO_ENABLED=0 go build -trimpath -buildvcs=false \
    -ldflags "-X helm.sh/helm/v4/internal/version.version=$helm_release" -o "$out/bin/" helm.sh/helm/v4/cmd/helm)
echo "$stamp" >"$out/stamp"
echo "setup: built $("$out/bin/kube-apiserver" --version) and $("$out/bin/etcd" --version | head -1) in $((SECONDS - started)) s"
