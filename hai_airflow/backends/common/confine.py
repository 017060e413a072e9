"""Where user-given paths may live: the confinement rule, pure but for resolving symlinks."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from hai_airflow.backends.common.safefs import open_dir_below

NEVER_MOUNTABLE: tuple[str, ...] = (
    "/proc", "/sys", "/dev", "/etc", "/run", "/var/run", "/boot", "/root", "/bin", "/sbin", "/lib",
    "/lib32", "/lib64", "/usr", "/var/lib/docker", "/var/lib/containerd", "/var/lib/kubelet",
)  # fmt: skip
"""System paths: nothing at or below them is ever mounted into a job, whatever the config says."""

DOCKER_SOCKETS: tuple[str, ...] = ("/var/run/docker.sock", "/run/docker.sock")
"""Engine sockets: a job that sees one is root on the host, so no mount may contain them."""

PLACEHOLDERS: tuple[str, ...] = ("{user}", "{group}")
"""What `[paths] allowed` roots may contain; each is replaced by the job owner's name or group."""


@dataclass(frozen=True)
class PathRules:
    """Everything the rule needs to judge one job's paths."""

    allowed: tuple[str, ...] | None
    """Roots (already filled in for the job's owner) user-given paths must lie under; None = anywhere."""
    home: str | None
    """The server's $HAI_HOME: its state, and every job's directory (None: a backend used alone)."""
    own_dir: str | None = None
    """The job's own directory under $HAI_HOME, once it has one (at launch); None at submission."""
    protected: tuple[str, ...] = ()
    """More paths no mount may contain (e.g. the socket of the engine the backend talks to)."""


class PathRefused(ValueError):
    """A user-given path that must not be used: which field, why, and how to fix it."""

    def __init__(self, field: str, path: str, reason: str, fix: str):
        self.field = field
        self.path = path
        self.reason = reason
        self.fix = fix
        super().__init__(f"{field} {path}: {reason}")


def _under(path: str, root: str) -> bool:
    """True when `path` is `root` or lies below it (both absolute and normalised)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def fill_root(template: str, user: str, group: str) -> str | None:
    """A `[paths] allowed` root for one user; None when a name would add or climb a path level."""
    for placeholder, name in (("{user}", user), ("{group}", group)):
        if placeholder in template and (not name or "/" in name or name in (".", "..")):
            return None
    return template.replace("{user}", user).replace("{group}", group)


def template_problem(template: str) -> str | None:
    """Why a `[paths] allowed` root cannot be used, or None."""
    if not template.startswith("/"):
        return f"{template!r} is not an absolute path"
    if ".." in PurePosixPath(template).parts:
        return f"{template!r} contains '..'"
    rest = template
    for placeholder in PLACEHOLDERS:
        rest = rest.replace(placeholder, "")
    if "{" in rest or "}" in rest:
        return f"{template!r} has a placeholder other than {{user}} and {{group}}"
    return None


def allowed_roots(templates: Sequence[str] | None, user: str, group: str) -> tuple[str, ...] | None:
    """The roots one user's paths may lie under (None = no `[paths] allowed`: anywhere)."""
    if templates is None:
        return None
    return tuple(r for t in templates if (r := fill_root(t, user, group)) is not None)


def _versions(path: str) -> list[str]:
    """The path as written, then with every symlink resolved (both must obey the rule)."""
    return list(dict.fromkeys((os.path.normpath(path), os.path.realpath(path))))


_ALWAYS_GUARDED: tuple[tuple[str, str], ...] = tuple(
    (version, path) for path in (*NEVER_MOUNTABLE, *DOCKER_SOCKETS) for version in _versions(path)
)
"""(resolved or written path, its name) of the system paths and sockets: resolved once, they do not move."""


@dataclass(frozen=True)
class _Resolved:
    """The rules' own paths, written and resolved, once per check."""

    homes: tuple[str, ...]
    own: tuple[str, ...]
    guarded: tuple[tuple[str, str], ...]
    """(path, name) that no mount or scanned dir may contain."""


def _resolve(rules: PathRules) -> _Resolved:
    homes = tuple(_versions(rules.home)) if rules.home else ()
    own = tuple(_versions(rules.own_dir)) if rules.own_dir else ()
    guarded = [(v, p) for p in rules.protected for v in _versions(p)]
    guarded += [(v, "the server's $HAI_HOME") for v in homes]
    return _Resolved(homes, own, (*_ALWAYS_GUARDED, *guarded))


def system_problem(path: str, resolved: _Resolved, whole_tree: bool) -> str | None:
    """Why `path` (absolute, normalised) may never be used, or None.

    `whole_tree`: everything below the path becomes visible (a mount, a scanned model dir), so it
    may not contain the server's state or a system path either; a local job's working directory
    only reads what its OS user may read anyway.
    """
    if path == "/":
        return "it is the root directory"
    for never in NEVER_MOUNTABLE:
        if _under(path, never):
            return f"it is at or below the system path {never}"
    for inner, name in resolved.guarded if whole_tree else ():
        if _under(inner, path):
            return f"it contains {name}"
    if any(_under(path, home) for home in resolved.homes) and not any(_under(path, d) for d in resolved.own):
        return "it lies in the server's $HAI_HOME outside this job's own directory"
    return None


def confine(path: str, rules: PathRules, field: str, whole_tree: bool = True) -> str:
    """The path with symlinks resolved if the job may use it; else raise `PathRefused` naming `field`.

    Checked as written and as resolved: a symlink inside an allowed root that leads out is refused.
    """
    fix = "Use a directory of your own under the allowed roots, without '..' or symlinks leading out"
    if not path.startswith("/"):
        raise PathRefused(
            field, path, "it is not an absolute path", "Give the full path, e.g. /nas/you/project"
        )
    if ".." in PurePosixPath(path).parts:
        raise PathRefused(field, path, "it contains '..'", fix)
    try:
        versions = _versions(path)
    except OSError as e:
        # a component changed while it was resolved (a symlink swapped for a directory: EINVAL)
        reason = f"it changed while it was checked ({e.strerror or e})"
        raise PathRefused(field, path, reason, "Submit again once the path stays put") from None
    resolved = _resolve(rules)
    for version in versions:
        problem = system_problem(version, resolved, whole_tree)
        if problem is not None:
            raise PathRefused(field, path, f"{problem}; it is never given to a job", fix)
    if rules.allowed is not None:
        roots = [*(v for r in rules.allowed for v in _versions(r)), *resolved.own]
        for version in versions:
            if not any(_under(version, r) for r in roots):
                where = ", ".join(rules.allowed) or "none for you"
                resolved_to = "" if version == os.path.normpath(path) else f" (resolves to {version})"
                raise PathRefused(field, path, f"it is outside the allowed roots ({where}){resolved_to}", fix)
    return versions[-1]


def storage_problem(path: str, rules: PathRules) -> str | None:
    """Why a configured project storage may not be mounted, or None (the admin chose the path)."""
    resolved = _resolve(rules)
    # The admin may keep storages in $HAI_HOME, but never among the job directories.
    outside_jobs = replace(resolved, homes=tuple(os.path.join(h, "jobs") for h in resolved.homes), own=())
    for version in _versions(path):
        problem = system_problem(version, outside_jobs, whole_tree=True)
        if problem is not None:
            return f"{version}: {problem}"
    return None


def relative_problem(path: str) -> str | None:
    """Why a relative model_dir (kept inside the job's own directory) cannot be used, or None."""
    if ".." in PurePosixPath(path).parts:
        return "it contains '..'"
    return None


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_beneath(root: str, path: str) -> int:
    """An open fd of the directory `path`, reached from `root` following no link at any component.

    The one way the server opens a directory a user may write (a model dir, for the checkpoint scan
    and for `hai cp`). `root` is the admin's (an allowed root, or a job's own dir) and is opened as
    it is; below it every component is opened from its parent's fd with O_NOFOLLOW
    (`safefs.open_dir_below`), so a component swapped for a symlink, whenever the swap happens,
    refuses the walk: even a link that stays beneath `root` (a group share's admin swapping a
    member's dir for a link to another dir the member may read) leads nowhere. Raises UnsafeFile
    (ELOOP/ENOTDIR) naming the component that is a link or no directory, PermissionError for a path
    not beneath `root`, and OSError as `open` would.
    """
    rel = os.path.relpath(os.path.normpath(path), os.path.normpath(root))
    if rel == ".." or rel.startswith("../"):
        raise PermissionError(errno.EACCES, f"{path} is not beneath {root}")
    return open_dir_below(Path(root), [p for p in PurePosixPath(rel).parts if p != "."])


def make_beneath(root: str, path: str, mode: int = 0o755, owner: tuple[int, int] | None = None) -> None:
    """Create the dir `path` (and its missing parents) below `root` (an admin's dir), one component at
    a time from `root`'s fd, following no link: a component that is a link is refused
    (PermissionError), so nothing is ever created outside `root`. What it creates is given to
    `owner` (uid, gid) when one is named."""
    rel = os.path.relpath(os.path.normpath(path), os.path.normpath(root))
    if rel == ".." or rel.startswith("../"):
        raise PermissionError(f"{path} is not beneath {root}")
    fd = os.open(root, _DIRECTORY)
    try:
        for name in PurePosixPath(rel).parts:
            if name == ".":
                continue
            made = False
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=fd)
                made = True
            try:
                below = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PermissionError(f"{path}: {name} is not a directory of the job's own") from None
                raise
            os.close(fd)
            fd = below
            if made and owner is not None:
                os.fchown(fd, *owner)
    finally:
        os.close(fd)
