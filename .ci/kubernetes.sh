#!/usr/bin/env bash
# Build (once, cached outside the repo) a real kube-apiserver from Debian's kubernetes source package.
#
#   .ci/kube-apiserver.sh          build if missing, print the binary's path
#   .ci/kube-apiserver.sh --path   print the path the binary has or will have
#
# The test fixture (tests/support/kube_apiserver.py) starts it with etcd per test session; it finds
# the binary through HAI_KUBE_APISERVER or this cache path. Idempotent: a second run is instant.
set -euo pipefail

CACHE="${HAI_CI_CACHE:-/var/cache/hai-ci}/kube"
BIN="$CACHE/bin/kube-apiserver"

if [[ "${1:-}" == "--path" ]]; then
    echo "$BIN"
    exit 0
fi
log() { echo "kube-apiserver.sh: $*" >&2; }
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

# What the tests need to run the server: etcd beside it, openssl for its service-account key.
ensure etcd-server openssl
if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
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

log "building cmd/kube-apiserver (several minutes on a cold cache)"
start=$(date +%s)
# The release build wants git metadata; a source package has none, so give it the version directly.
# Debian versions it "1.20.5+really1.20.2-…": the part after "really" is the true upstream version.
version=$(dpkg-parsechangelog -S Version | sed 's/^.*really//; s/-.*//; s/+.*//')
export KUBE_GIT_VERSION="v${version}" KUBE_GIT_TREE_STATE=clean
export GOFLAGS=-mod=vendor GO111MODULE=on
nice -n 19 make WHAT=cmd/kube-apiserver >&2
cp "$(find _output -type f -name kube-apiserver -perm -u+x | head -n1)" "$BIN"
log "built $("$BIN" --version) in $(($(date +%s) - start)) s"
echo "$BIN"
