#!/usr/bin/env bash
# A private Docker engine for the tests: install Debian's docker.io if needed, start/stop one dockerd.
#
#   .ci/docker.sh install       install docker.io, busybox-static, debootstrap, docker-compose when missing
#   .ci/docker.sh start DIR     start dockerd with its state under DIR; prints its DOCKER_HOST
#   .ci/docker.sh stop DIR      stop the dockerd started under DIR
#   .ci/docker.sh torch-rootfs  build (once, cached) a Debian root with python3 + torch as a tar for
#                               `docker import`; prints its path (the name carries its content key)
#
# The engine runs with --bridge=none and no iptables: it must not touch the host's network set-up.
# Containers that need to talk to each other (distributed workers) use the host network.
set -euo pipefail

log() { echo "docker.sh: $*" >&2; }

install() {
    local need=() pkg
    for pkg in docker.io busybox-static debootstrap docker-compose; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    if ((${#need[@]})); then
        log "installing ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
            || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
    fi
}

# containerd's sockets live under the exec root and a unix socket path is limited to 108 bytes,
# so the exec root gets a short path of its own, named after DIR.
exec_root() { echo "/tmp/hai-dexec-$(echo -n "$1" | md5sum | cut -c1-10)"; }

start() {
    local dir=$1
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd -P)
    local sock="$dir/docker.sock" er
    er=$(exec_root "$dir")
    if [[ -S "$sock" ]] && DOCKER_HOST="unix://$sock" docker version >/dev/null 2>&1; then
        echo "unix://$sock"
        return
    fi
    command -v dockerd >/dev/null || { log "dockerd is not installed; run: $0 install"; exit 1; }
    mkdir -p "$dir/data" "$er"
    # setsid: a Ctrl-C or a group kill aimed at the caller (a test run) must not hit the engine.
    setsid dockerd --data-root "$dir/data" --exec-root "$er" --pidfile "$dir/dockerd.pid" \
        -H "unix://$sock" --bridge=none --iptables=false --ip-masq=false --ip6tables=false \
        >"$dir/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 1 150); do
        if DOCKER_HOST="unix://$sock" docker version >/dev/null 2>&1; then
            echo "unix://$sock"
            return
        fi
        sleep 0.1
    done
    log "dockerd did not answer on $sock within 15 s; last log lines:"
    tail -n 20 "$dir/dockerd.log" >&2
    exit 1
}

stop() {
    local dir=$1 pid
    [[ -d "$dir" ]] && dir=$(cd "$dir" && pwd -P)
    [[ -f "$dir/dockerd.pid" ]] || return 0
    pid=$(cat "$dir/dockerd.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$dir/dockerd.pid"
    # A network namespace or overlay the engine did not unmount would keep its directories busy.
    local point er
    er=$(exec_root "$dir")
    for point in $(awk -v a="$er/" -v b="$dir/" 'index($2, a) == 1 || index($2, b) == 1 {print $2}' /proc/mounts \
        | sort -r); do
        umount -l "$point" || true
    done
    rm -rf "$er"
}

CACHE="${HAI_CI_CACHE:-/var/cache/hai-ci}/images"
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
TORCH_PACKAGES=python3,python3-torch,python3-numpy

# Unmount what debootstrap may have left mounted in a build root before deleting it: a recursive delete
# must never walk into the host's /proc or /dev.
remove_root() {
    local root=$1 point
    [[ -e "$root" ]] || return 0
    root=$(cd "$root" && pwd -P)
    for point in $(awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
        umount -l "$point" || true
    done
    if awk -v r="$root/" 'index($2, r) == 1 {found=1} END {exit !found}' /proc/mounts; then
        log "$root still has mounts inside; remove it by hand"
        exit 1
    fi
    rm -rf "$root"
}

torch_rootfs() {
    local key tar work started
    key=$(echo "$SUITE $MIRROR $TORCH_PACKAGES $(dpkg-query -W -f='${Version}' debootstrap)" | sha256sum | cut -c1-12)
    tar="$CACHE/torch-$key.tar"
    if [[ -f "$tar" ]]; then
        echo "$tar"
        return
    fi
    command -v debootstrap >/dev/null || { log "debootstrap is missing; run: $0 install"; exit 1; }
    mkdir -p "$CACHE"
    work="$CACHE/torch-$key.build"
    remove_root "$work"
    mkdir -p "$work/root"
    started=$(date +%s)
    log "debootstrap $SUITE with $TORCH_PACKAGES (a few minutes, once)"
    debootstrap --variant=minbase --include="$TORCH_PACKAGES" "$SUITE" "$work/root" "$MIRROR" >"$work.log" 2>&1 \
        || { tail -n 20 "$work.log" >&2; exit 1; }
    rm -rf "$work/root/var/cache/apt/archives" "$work/root/var/lib/apt/lists" \
        "$work/root/usr/share/doc" "$work/root/usr/share/man"
    tar -C "$work/root" -cf "$tar.partial" .
    mv "$tar.partial" "$tar"
    remove_root "$work"
    rm -f "$work.log"
    log "built $tar in $(($(date +%s) - started)) s"
    echo "$tar"
}

case "${1:-install}" in
    install) install ;;
    start) start "${2:?usage: $0 start DIR}" ;;
    stop) stop "${2:?usage: $0 stop DIR}" ;;
    torch-rootfs) torch_rootfs ;;
    *) log "usage: $0 install | start DIR | stop DIR | torch-rootfs"; exit 2 ;;
esac
