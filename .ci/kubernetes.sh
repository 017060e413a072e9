#!/usr/bin/env bash
# Build (once, cached outside the repo) a real Kubernetes control plane and node from Debian's kubernetes
# source package: kube-apiserver, kube-scheduler, kube-controller-manager and kubelet (whose built-in
# dockershim runs pods on the Docker tier's private dockerd), all in one parallel `make`.
#
#   .ci/kubernetes.sh          build what is missing, print the binaries' directory
#   .ci/kubernetes.sh --path   print the directory the binaries have or will have
#
# The test fixtures (tests/support/kube_apiserver.py, tests/support/kube_node.py) find them through
# HAI_KUBE_BIN or this cache path. Idempotent: a second run is instant.
set -euo pipefail

CACHE="${HAI_CI_CACHE:-/var/cache/hai-ci}/kube"
BINDIR="$CACHE/bin"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubelet)

if [[ "${1:-}" == "--path" ]]; then
    echo "$BINDIR"
    exit 0
fi
log() { echo "kubernetes.sh: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive

ensure() {
    local need=() pkg
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    if ((${#need[@]})); then
        log "installing ${need[*]}"
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
            || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
    fi
}

# What the tests need to run the cluster: etcd beside it, openssl for its service-account key and
# serving certificates, gcc for the static pause binary of the pods' sandbox image, the CNI plugins
# (bridge, host-local, loopback) for the pod network.
ensure etcd-server openssl gcc libc6-dev containernetworking-plugins
missing=()
for name in "${BINARIES[@]}"; do
    "$BINDIR/$name" --version >/dev/null 2>&1 || missing+=("$name")
done
if ((${#missing[@]} == 0)); then
    echo "$BINDIR"
    exit 0
fi

# Source packages need a deb-src entry; the image ships binary sources only.
SRC_LIST=/etc/apt/sources.list.d/hai-ci-deb-src.sources
if ! grep -rqs '^Types:.*deb-src\|^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding a deb-src entry ($SRC_LIST)"
    cat >"$SRC_LIST" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt-get update -qq
fi

ensure golang-go rsync golang-github-modern-go-reflect2-dev dpkg-dev make

mkdir -p "$CACHE/src" "$CACHE/bin"
cd "$CACHE/src"
tree=$(find . -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
if [[ -z "$tree" ]]; then
    log "fetching the kubernetes source package"
    apt-get source -qq kubernetes >/dev/null
    tree=$(find . -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
fi
cd "$tree"

# The vendored reflect2 predates Go 1.18's runtime changes and crashes at start-up under Debian's Go 1.19;
# Debian's packaged reflect2 1.0.2 is API-compatible and works.
vendored=vendor/github.com/modern-go/reflect2
if [[ ! -e "$vendored/.hai-replaced" ]]; then
    log "replacing $vendored with golang-github-modern-go-reflect2-dev"
    rm -rf "$vendored"
    mkdir -p "$vendored"
    cp -r /usr/share/gocode/src/github.com/modern-go/reflect2/. "$vendored/"
    touch "$vendored/.hai-replaced"
fi

log "building ${missing[*]} (one make, several minutes on a cold cache)"
start=$(date +%s)
# The release build wants git metadata; a source package has none, so give it the version directly.
# Debian versions it "1.20.5+really1.20.2-…": the part after "really" is the true upstream version.
version=$(dpkg-parsechangelog -S Version | sed 's/^.*really//; s/-.*//; s/+.*//')
export KUBE_GIT_VERSION="v${version}" KUBE_GIT_TREE_STATE=clean
export GOFLAGS=-mod=vendor GO111MODULE=on
what=$(printf 'cmd/%s ' "${missing[@]}")
# `make` hands WHAT to one `go install`, which builds the shared packages once, on every CPU (go -p).
nice -n 19 make WHAT="${what% }" >&2
for name in "${missing[@]}"; do
    cp "$(find _output -type f -name "$name" -perm -u+x | head -n1)" "$BINDIR/$name"
done
log "built ${missing[*]} ($("$BINDIR/kube-apiserver" --version)) in $(($(date +%s) - start)) s"
echo "$BINDIR"
