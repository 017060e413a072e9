#!/usr/bin/env bash
# Build (once, cached outside the repo) a Horovod wheel for the test environment's torch, and install it.
#
#   .ci/horovod.sh wheel PYTHON     build the wheel for PYTHON's torch if missing; print its path
#   .ci/horovod.sh install PYTHON   build if missing, then install it (and its few dependencies)
#
# Horovod 0.28.1 is the last release. It builds from its sdist against torch 2.x CPU with gloo only
# (no MPI, no TensorFlow, no MXNet) after one change: its CMake files ask for C++14, and torch 2.x's
# headers need C++17 (std::is_same_v). The wheel's name carries what it was built against, so a new
# torch or Python builds a new one. Idempotent: a second run takes seconds.
set -euo pipefail

VERSION=0.28.1
CACHE="${HAI_CI_CACHE:-/var/cache/hai-ci}/horovod"
log() { echo "horovod.sh: $*" >&2; }

key_of() {
    local py=$1
    "$py" -c 'import sys, torch; print(f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}")'
}

wheel() {
    local py=$1 key dir work started
    key=$(key_of "$py") || { log "$py cannot import torch; install the project first (make install)"; exit 1; }
    dir="$CACHE/$VERSION-$key"
    if compgen -G "$dir/horovod-*.whl" >/dev/null; then
        ls "$dir"/horovod-*.whl
        return
    fi
    # One build per key at a time (provisioning and a test session may both ask for it).
    mkdir -p "$CACHE"
    exec 9>"$dir.lock"
    flock 9
    if compgen -G "$dir/horovod-*.whl" >/dev/null; then
        ls "$dir"/horovod-*.whl
        return
    fi
    command -v cmake >/dev/null && command -v g++ >/dev/null || {
        log "installing cmake and g++"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq --no-install-recommends cmake g++ >/dev/null \
            || { apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake g++ >/dev/null; }
    }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    started=$(date +%s)
    "$py" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$work" 2>&1 | grep -v '^WARNING' >&2 || true
    tar -C "$work" -xzf "$work/horovod-$VERSION.tar.gz"
    local src="$work/horovod-$VERSION"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    log "building Horovod $VERSION for $key (about 10 minutes on 2 cores, once)"
    mkdir -p "$dir.partial"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS= MAKEFLAGS="-j$(nproc)" \
        "$py" -m pip wheel -q --no-build-isolation --no-deps -w "$dir.partial" "$src" >"$work/build.log" 2>&1 \
        || { tail -n 30 "$work/build.log" >&2; exit 1; }
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    log "built $(ls "$dir") in $(($(date +%s) - started)) s"
    ls "$dir"/horovod-*.whl
}

install() {
    local py=$1 whl
    whl=$(wheel "$py")
    if "$py" -c "import horovod, horovod.torch, sys; sys.exit(horovod.__version__ != '$VERSION')" 2>/dev/null; then
        echo "$whl"
        return
    fi
    "$py" -m pip install -q --disable-pip-version-check "$whl" 2>&1 | grep -v '^WARNING' >&2 || true
    "$py" -c 'import horovod.torch' || { log "the installed Horovod does not import"; exit 1; }
    echo "$whl"
}

case "${1:-}" in
    wheel) wheel "${2:?usage: $0 wheel PYTHON}" ;;
    install) install "${2:?usage: $0 install PYTHON}" ;;
    *) log "usage: $0 wheel PYTHON | install PYTHON"; exit 2 ;;
esac
