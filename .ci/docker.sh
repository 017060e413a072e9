#!/usr/bin/env bash
# A private Docker engine for the tests: install Debian's docker.io if needed, start/stop one dockerd.
#
#   .ci/docker.sh install       install docker.io, busybox-static, debootstrap, docker-compose when missing
#   .ci/docker.sh start DIR     start dockerd with its state under DIR; prints its DOCKER_HOST
#   .ci/docker.sh stop DIR      stop the dockerd started under DIR
#   .ci/docker.sh torch-rootfs [PYTHON]
#                               build (once, cached) a Debian root for `docker import` with python3 and
#                               PYTHON's torch (a CPU build) and Horovod (the wheel .ci/horovod.sh builds
#                               for it); PYTHON defaults to the project's .venv. Prints the tar's path,
#                               whose name carries its content key.
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
    # runc-oom-floor: pods of the kube node tier ask for a negative oom_score_adj, which this machine refuses.
    setsid dockerd --data-root "$dir/data" --exec-root "$er" --pidfile "$dir/dockerd.pid" \
        -H "unix://$sock" --bridge=none --iptables=false --ip-masq=false --ip6tables=false \
        --add-runtime "hai-runc=$(cd "$(dirname "$0")" && pwd -P)/runc-oom-floor" --default-runtime hai-runc \
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
HERE=$(cd "$(dirname "$0")" && pwd -P)
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
ROOT_PACKAGES=python3

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

# The root gets the test environment's own torch and Horovod, installed by the host's pip into the root's
# dist-packages: the host is Debian 12 with Python 3.11 like the root, so the same cp311 wheels fit. torch
# is pinned to PYTHON's exact version, which must be a CPU build: an unpinned or CUDA torch is gigabytes.
torch_rootfs() {
    local py=$1 pyver torch numpy whl key tar work root site seen started
    pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') \
        || { log "$py does not run; install the project first (make install)"; exit 1; }
    read -r torch numpy < <("$py" -c 'import torch, numpy; print(torch.__version__, numpy.__version__)') \
        || { log "$py cannot import torch and numpy; install the project first (make install)"; exit 1; }
    [[ $torch == *+cpu ]] || { log "$py has torch $torch, not a CPU build; install torch==${torch%%+*}+cpu"; exit 1; }
    whl=$("$HERE/horovod.sh" wheel "$py") || { log "no Horovod wheel for $py (see above)"; exit 1; }
    key=$(echo "$SUITE $MIRROR $ROOT_PACKAGES $(dpkg-query -W -f='${Version}' debootstrap) python$pyver" \
        "torch==$torch numpy==$numpy $(basename "$whl") $(sha256sum <"$whl")" | sha256sum | cut -c1-12)
    tar="$CACHE/torch-$key.tar"
    [[ -f "$tar" ]] && { echo "$tar"; return; }
    command -v debootstrap >/dev/null || { log "debootstrap is missing; run: $0 install"; exit 1; }
    mkdir -p "$CACHE"
    # One build per key at a time (provisioning and a test session may both ask for it).
    exec 9>"$CACHE/torch-$key.lock"
    flock 9
    [[ -f "$tar" ]] && { echo "$tar"; return; }
    work="$CACHE/torch-$key.build"
    root="$work/root"
    site="$root/usr/local/lib/python$pyver/dist-packages"
    remove_root "$work"
    mkdir -p "$root"
    started=$(date +%s)
    log "debootstrap $SUITE with $ROOT_PACKAGES, then torch $torch, numpy $numpy, $(basename "$whl") (minutes, once)"
    failed() { tail -n 20 "$work.log" >&2; log "$1"; exit 1; }
    debootstrap --variant=minbase --include="$ROOT_PACKAGES" "$SUITE" "$root" "$MIRROR" >"$work.log" 2>&1 \
        || failed "debootstrap failed"
    [[ -x "$root/usr/bin/python$pyver" ]] || failed "the root has no python$pyver like $py, so its wheels would not fit"
    "$py" -m pip install -q --disable-pip-version-check --no-warn-script-location --target "$site" \
        "torch==$torch" "numpy==$numpy" "$whl" >>"$work.log" 2>&1 || failed "pip could not install into the root"
    # Console scripts carry the host's interpreter in their #! line; the root runs modules with python3 -m.
    rm -rf "$site/bin"
    # Without /proc torch only warns (about /proc/cpuinfo), so the check reads stdout alone.
    seen=$(chroot "$root" "/usr/bin/python$pyver" -c 'import torch, numpy, horovod.torch; print(torch.__version__)' \
        2>>"$work.log") || failed "the root's python cannot import torch and horovod.torch"
    [[ $seen == "$torch" ]] || failed "the root's torch is $seen, not $torch"
    rm -rf "$root/var/cache/apt/archives" "$root/var/lib/apt/lists" \
        "$root/usr/share/doc" "$root/usr/share/man"
    tar -C "$root" -cf "$tar.partial" .
    mv "$tar.partial" "$tar"
    remove_root "$work"
    rm -f "$work.log" "$CACHE/torch-$key.lock"
    # A root built for an earlier torch or wheel is never asked for again.
    find "$CACHE" -maxdepth 1 -name 'torch-*.tar' ! -name "torch-$key.tar" -delete
    log "built $tar ($(du -m "$tar" | cut -f1) MB) in $(($(date +%s) - started)) s"
    echo "$tar"
}

case "${1:-install}" in
    install) install ;;
    start) start "${2:?usage: $0 start DIR}" ;;
    stop) stop "${2:?usage: $0 stop DIR}" ;;
    torch-rootfs) torch_rootfs "${2:-$HERE/../.venv/bin/python}" ;;
    *) log "usage: $0 install | start DIR | stop DIR | torch-rootfs [PYTHON]"; exit 2 ;;
esac
