"""A python3 base image to build the product Dockerfile from where Docker Hub cannot be reached.

Debian 12 (debootstrap minbase, like python:3.11-slim-bookworm underneath) with python3 and its venv
module, trusting the CAs this host trusts (pip in the build reaches PyPI through the host's network).
The root is built once into the CI cache (about 1.5 min), then imported in seconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CACHE = Path(os.environ.get("HAI_CI_CACHE", "/var/cache/hai-ci")) / "images"
ENV = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    # pip (23.0 in bookworm) trusts its own certifi bundle unless told otherwise.
    f"ENV PIP_CERT={HOST_CA}",
)


def _key() -> str:
    debootstrap = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "debootstrap"], capture_output=True, text=True
    ).stdout
    ca = hashlib.sha256(HOST_CA.read_bytes()).hexdigest() if HOST_CA.exists() else "none"
    text = f"{SUITE} {MIRROR} {' '.join(PACKAGES)} {debootstrap} {ca}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _mounts_under(root: Path) -> list[str]:
    prefix = f"{root}/"
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return sorted((p for p in points if p.startswith(prefix)), reverse=True)


def _remove_root(root: Path) -> None:
    """Unmount what debootstrap may have left mounted (its /proc, /sys) before deleting the root."""
    if not root.exists():
        return
    for point in _mounts_under(root.resolve()):
        subprocess.run(["umount", "-l", point], check=False)
    if _mounts_under(root.resolve()):
        raise RuntimeError(f"{root} still has mounts inside; remove it by hand")
    shutil.rmtree(root)


def base_rootfs_tar() -> Path:
    """The cached root's tar; built on first use. Raises RuntimeError saying why it cannot be."""
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise RuntimeError("building the base root needs root and debootstrap (.ci/docker.sh install)")
    key = _key()
    tar = CACHE / f"python-base-{key}.tar"
    if tar.exists():
        return tar
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"python-base-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key, whoever asks first
        if tar.exists():
            return tar
        work = CACHE / f"python-base-{key}.build"
        _remove_root(work)
        root = work / "root"
        root.mkdir(parents=True)
        done = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), MIRROR],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            _remove_root(work)
            raise RuntimeError(f"debootstrap failed: {(done.stdout + done.stderr)[-800:]}")
        if HOST_CA.exists():
            shutil.copyfile(HOST_CA, root / "etc/ssl/certs/ca-certificates.crt")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(root / junk, ignore_errors=True)
        partial = tar.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True, timeout=300)
        partial.rename(tar)
        _remove_root(work)
    for old in CACHE.glob("python-base-*.tar"):
        if old != tar:
            old.unlink(missing_ok=True)
    return tar


def python_base_image(client: object) -> str:
    """The base imported into `client`'s engine (docker.DockerClient), tagged by its content key."""
    import docker

    tar = base_rootfs_tar()
    tag = f"hai-ci/python-base:{tar.stem.removeprefix('python-base-')}"
    try:
        client.images.get(tag)  # type: ignore[attr-defined]
    except docker.errors.ImageNotFound:
        repo, _, version = tag.partition(":")
        client.api.import_image_from_file(str(tar), repository=repo, tag=version, changes=list(ENV))  # type: ignore[attr-defined]
    return tag
