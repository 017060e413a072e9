"""A job's git repository: which ones a job may name, and the `git clone` its own process runs.

The clone is part of the job's start, run by the job's own process as the job's account (never by the
server, never in the controller's loop): a clone that hangs holds its own job only, a cancel ends it,
and a repository is read with exactly the rights of the person who named it.

Which repositories (`repository_problem`): a URL with an allowed scheme (https and ssh by default) to a
host the config allows (`[git] allowed_hosts`), the scp-like `user@host:path` form counted as ssh, or
an absolute path on the server (confined like a NAS code path). Never a remote helper (`ext::`,
`fd::`), `file://` or an option in disguise. The clone itself allows only the same protocols, so a
submodule or redirect cannot reach another one.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from typing import Literal
from urllib.parse import urlsplit

DEFAULT_SCHEMES: tuple[Literal["https", "ssh", "http", "git"], ...] = ("https", "ssh")
CLONE_FAILED_EXIT = 128
"""The exit code of a job whose clone failed (git's own code for a fatal error)."""


def is_remote(url: str) -> bool:
    """True for a URL or scp-like `host:path`; False for a path on the server."""
    return "://" in url or "::" in url or ":" in url.split("/", 1)[0]


def _host_allowed(host: str, port: int | None, allowed_hosts: Collection[str]) -> bool:
    host = host.lower()
    return any(a.lower() in (host, f"{host}:{port}") for a in allowed_hosts)


def repository_problem(
    url: str, allowed_hosts: Collection[str], schemes: Collection[str] = DEFAULT_SCHEMES
) -> tuple[str, str] | None:
    """(why, fix) when a job may not name repository `url`; None when it may."""
    if not url or url.startswith("-") or any(c.isspace() or ord(c) < 32 for c in url):
        return "it is not a repository URL or path", "Give an https:// or ssh:// URL, or an absolute path"
    if "::" in url.split("/", 1)[0]:
        return (
            "remote helpers (transport::address, such as ext:: or fd::) run programs on the cluster",
            "Give an https:// or ssh:// URL",
        )
    if not is_remote(url):
        if not url.startswith(("/", "~")):
            return "a relative path has no meaning on the cluster", "Give the repository's absolute path"
        return None
    allowed_schemes = ", ".join(s + "://" for s in schemes)
    if "://" in url:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            host, port = parts.hostname or "", parts.port
        except ValueError:
            return "its port is not a number", "Give a URL such as https://git.example.com/team/repo.git"
    else:  # scp-like [user@]host:path, which git reads as ssh
        scheme, port = "ssh", None
        host = url.split(":", 1)[0].rpartition("@")[2]
    if scheme == "file":
        return "file:// URLs are not cloned", "Give the repository's absolute path without file://"
    if scheme not in schemes:
        return f"{scheme}:// is not an allowed protocol", f"Use {allowed_schemes}"
    if not host or not _host_allowed(host, port, allowed_hosts):
        hosts = ", ".join(allowed_hosts) or "none: the platform admin lists them in [git] allowed_hosts"
        return f"host {host or '(none)'} is not one jobs may clone from", f"Use an allowed host ({hosts})"
    return None


def clone_argv(
    url: str, branch: str | None, dest: str, schemes: Collection[str] = DEFAULT_SCHEMES
) -> list[str]:
    """`git clone` of `branch` (default: the default branch) of `url` into `dest`, only over `schemes`
    (and the local transport for a path on the server)."""
    allowed = [*schemes, *([] if is_remote(url) else ["file"])]
    # An allowed host's redirect must not lead the clone to a host the rules never allowed.
    argv = ["git", "-c", "protocol.allow=never", "-c", "http.followRedirects=false"]
    for scheme in allowed:
        argv += ["-c", f"protocol.{scheme}.allow=always"]
    argv += ["clone", "--quiet", "--depth", "1", "--single-branch", "--no-recurse-submodules"]
    if not is_remote(url):
        argv.append("--no-local")  # through upload-pack, as from a remote: a shallow copy, no hardlinks
    if branch:
        argv += ["--branch", branch]
    return [*argv, "--", url, dest]


def clone_script(
    url: str, branch: str | None, dest: str, timeout: float, schemes: Collection[str] = DEFAULT_SCHEMES
) -> str:
    """Shell lines that make `dest` a fresh clone within `timeout` seconds and enter it, or end the job
    with CLONE_FAILED_EXIT and a line that says why; the job's command follows them."""
    what = f"git clone of {url}" + (f" (branch {branch})" if branch else "")
    # Never wait for a password prompt: a start must fail with a message instead.
    clone = shlex.join(["timeout", "-k", "5", f"{timeout:g}", *clone_argv(url, branch, dest, schemes)])
    failed = shlex.quote(f"hai: {what} failed; the command was not started")
    return (
        f"rm -rf -- {shlex.quote(dest)} && GIT_TERMINAL_PROMPT=0 GIT_ASKPASS=true {clone} "
        f"|| {{ echo {failed} >&2; exit {CLONE_FAILED_EXIT}; }}\n"
        f"cd -- {shlex.quote(dest)} || exit 126\n"
    )
